import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

struct Refresh: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "refresh", abstract: "Refresh an account now, ignoring its schedule.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func run() throws {
        try options.run(.refresh(account: account)) { "refreshed \($0.account) (\($0.state))" }
    }
}
