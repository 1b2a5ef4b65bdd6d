import Logging
import Synchronization

/// Logs that a connection limit was hit, at most once per kind every `interval`, with how
/// often it was hit since the last notice, so a flood of refusals cannot flood the journal.
final class LimitLog: Sendable {
    private struct Entry {
        var noticedAt: ContinuousClock.Instant
        var since = 0
    }

    private let logger: Logger
    private let interval: Duration
    private let entries = Mutex<[String: Entry]>([:])

    init(logger: Logger, interval: Duration = .seconds(10)) {
        self.logger = logger
        self.interval = interval
    }

    /// Records that `limit` refused or closed a connection of `peer`.
    func hit(_ limit: String, peer: PeerIdentity) {
        let now = ContinuousClock.now
        let missed: Int? = entries.withLock { entries in
            if let entry = entries[limit], entry.noticedAt.duration(to: now) < interval {
                entries[limit]?.since += 1
                return nil
            }
            let missed = entries[limit]?.since ?? 0
            entries[limit] = Entry(noticedAt: now)
            return missed
        }
        guard let missed else { return }
        logger.notice(
            "a connection limit was hit",
            metadata: ["limit": "\(limit)", "peer": "\(peer)", "hits unlogged before": "\(missed)"])
    }
}
