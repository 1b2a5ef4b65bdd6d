import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

struct SetTokens: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set-tokens",
        abstract: "Push new tokens into an account (clears needs_login).",
        discussion: "Reads a JSON tokens object from --from (a file, or - for stdin, the default).")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @Option(help: "File with the tokens as JSON, or - for stdin.") var from = "-"

    func run() throws {
        let tokens = try SecretInput.read(from, option: "--from", as: TokenSet.self)
        try options.run(.setTokens(account: account, tokens: tokens)) {
            "updated \($0.account) (\($0.state))"
        }
    }
}
