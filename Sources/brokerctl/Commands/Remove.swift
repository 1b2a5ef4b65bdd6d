import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

struct Remove: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove", abstract: "Delete an account and its secrets.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func run() throws {
        try options.run(.remove(account: account)) { "removed \($0.account)" }
    }
}
