import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// Follows the events of some accounts across broker restarts: when the connection breaks (the
/// broker stopped or restarted) or the broker drops the subscription as too slow, it subscribes
/// again after a delay that grows from 0.2 s to 5 s. The outage is told once when it begins and
/// once when it ends (`OutageReport`), not at each try.
struct EventFollower: Sendable {
    /// The first delay before subscribing again, and the longest.
    static let retryDelays: (first: Double, longest: Double) = (0.2, 5)

    let client: BlockingBrokerClient
    /// The accounts followed (all when `nil`).
    let accounts: [String]?
    /// What stderr says when the events are lost, given why.
    let lost: @Sendable (String) -> String
    /// What stderr says when they come again.
    let back: String

    /// Subscribes and hands each event to `body` for as long as the process lives; `subscribed`
    /// runs after each subscription the broker accepted (the events before it were missed).
    /// Fails only with what the broker answers that waiting will not change (e.g. `forbidden`).
    func run(subscribed: () throws -> Void, _ body: (BrokerEvent) throws -> Void) throws -> Never {
        var outage = OutageReport()
        var delay = Self.retryDelays.first
        while true {
            do {
                try client.watch(
                    accounts: accounts,
                    subscribed: {
                        outage.succeeded(back)
                        delay = Self.retryDelays.first
                        try subscribed()
                    }, body)
            } catch let error as ConnectionError {
                outage.failed(lost("\(error)"))
            } catch let error as BrokerError where error.code == .busy {
                outage.failed(lost(error.message))
            }
            var wait = timespec(tv_sec: Int(delay), tv_nsec: Int((delay - delay.rounded(.down)) * 1e9))
            var left = timespec()
            while nanosleep(&wait, &left) != 0, errno == EINTR { wait = left }
            delay = min(delay * 2, Self.retryDelays.longest)
        }
    }
}
