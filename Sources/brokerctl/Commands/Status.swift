import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status", abstract: "Show the state of every account, or of those named.",
        discussion: "Accounts named that do not exist are listed on stderr, with exit 4, after the others.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account names (all when none are given).", completion: AccountNames.completion)
    var accounts: [String] = []

    func run() throws {
        // One name is asked of the broker, which suggests a near name when it is unknown.
        let one = accounts.count == 1 ? accounts.first : nil
        var result = try GlobalOptions.reportingFailures(account: one, socket: options.socket) {
            try options.client().perform(.status(account: one))
        }
        let unknown = accounts.filter { name in !result.accounts.contains { $0.account == name } }
        if accounts.count > 1 { result.accounts.removeAll { !accounts.contains($0.account) } }
        try options.show(result) { result in
            (result.locked == true ? "the broker is locked; run brokerctl unlock\n" : "")
                + (result.memoryLocked == false
                    ? "warning: secrets are not all locked in memory (RLIMIT_MEMLOCK reached); see brokerd's log\n"
                    : "")
                + ([StatusTable.render(result.accounts, now: Date())]
                + StatusTable.hints(result.accounts, socket: options.socket))
                .joined(separator: "\n")
        }
        guard unknown.isEmpty else {
            let names = unknown.map { JSONText.quote($0) }.joined(separator: ", ")
            StandardStream.error.write("brokerctl: no account named \(names); list them with brokerctl status\n")
            throw ExitCode(.notFound)
        }
    }
}
