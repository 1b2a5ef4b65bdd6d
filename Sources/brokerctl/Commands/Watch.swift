import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract:
            "Show the state of the accounts, then their events live (refreshed, refresh_failed, needs_login, logged_out, added, removed, valid).",
        discussion: """
            First comes one "state" line per watched account, as status shows it; then one line per \
            event. valid: an account that was down (needs_login, logged_out, failing refreshes) serves \
            a token again. With --reconnect (the default when standard output is a terminal), a broker \
            that stops or restarts does not end the watch: brokerctl says so on stderr, connects again \
            (after 0.2 s, doubling up to 5 s), says when it is back, shows the state again and goes on.
            """)

    @OptionGroup var options: GlobalOptions
    @Flag(
        inversion: .prefixedNo,
        help: "Keep watching across broker restarts (default: on when standard output is a terminal).")
    var reconnect: Bool?
    @Argument(help: "Accounts to watch (all when none are given).", completion: AccountNames.completion) var accounts:
        [String] = []

    func run() throws {
        let client = try options.client()
        let watched = accounts.isEmpty ? nil : accounts
        let showState = {
            let status = try client.perform(.status())
            for account in status.accounts where watched?.contains(account.account) ?? true {
                StandardStream.output.write(
                    (options.json ? EventText.json(account, at: Date()) : EventText.human(account, at: Date())) + "\n")
            }
        }
        let show: (BrokerEvent) -> Void = { event in
            StandardStream.output.write((options.json ? EventText.json(event) : EventText.human(event)) + "\n")
        }
        try options.reportingFailures {
            if reconnect ?? (isatty(STDOUT_FILENO) == 1) {
                let socket = client.socketPath
                try EventFollower(
                    client: client, accounts: watched, lost: { "lost the broker at \(socket) (\($0)); reconnecting" },
                    back: "reconnected to the broker at \(socket)"
                ).run(subscribed: showState, show)
            } else {
                try client.watch(accounts: watched, subscribed: showState, show)
            }
        }
    }
}
