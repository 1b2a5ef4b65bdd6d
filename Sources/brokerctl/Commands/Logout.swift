import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

struct Logout: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "logout",
        abstract: "Revoke an account's credential at the IdP where it can be, then discard its tokens.",
        discussion: """
            The account and its settings stay (state logged_out) until new tokens are pushed with
            set-tokens. While the IdP cannot be reached, logout is refused and nothing is discarded,
            unless --force.
            """)

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @Flag(help: "Discard the credential even if the IdP cannot be reached to revoke it.") var force = false

    func run() throws {
        try options.run(.logout(account: account, force: force)) {
            "logged out \($0.account)" + ($0.revoked ? " (revoked at the IdP)" : " (discarded; not revoked at the IdP)")
        }
    }
}
