import ArgumentParser
import BrokerClient
import BrokerProtocol

/// `brokerctl header ACCOUNT`: the HTTP header that carries the account's token.
struct Header: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "header",
        abstract: "Print \"Authorization: Bearer TOKEN\", e.g. for curl -H \"$(brokerctl header api)\".")

    @OptionGroup var options: BridgeOptions
    @OptionGroup var narrowing: Narrowing
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func run() throws {
        let token = try GlobalOptions.reportingFailures { try options.token(of: account, narrowing: narrowing) }
        StandardStream.output.write("Authorization: \(token.tokenType) \(token.accessToken)\n")
    }
}
