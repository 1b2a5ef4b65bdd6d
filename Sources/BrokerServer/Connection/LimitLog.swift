import Logging
import Synchronization

/// Logs that a connection limit was hit, at most once per kind every `interval`, with how
/// often it was hit since the last notice, so a flood of refusals cannot flood the journal.
final class LimitLog: Sendable {
    private struct Entry {
        var noticedAt: ContinuousClock.Instant
        var since = 0
    }

    /// Most kinds remembered; past it, those not noticed within `interval` are forgotten, and
    /// new ones go unlogged while all are recent.
    static let maximumKinds = 1024

    private let logger: Logger
    private let interval: Duration
    private let entries = Mutex<[String: Entry]>([:])

    init(logger: Logger, interval: Duration = .seconds(10)) {
        self.logger = logger
        self.interval = interval
    }

    /// Records that `limit` refused or closed a connection of `peer`.
    func hit(_ limit: String, peer: PeerIdentity) {
        notice("a connection limit was hit", key: limit, metadata: ["limit": "\(limit)", "peer": "\(peer)"])
    }

    /// Logs `message` unless one of the same `key` was logged within `interval`; `metadata` is
    /// built only for a line that is logged (a flood of refusals costs a lookup each).
    func notice(_ message: Logger.Message, key: String, metadata: @autoclosure () -> Logger.Metadata) {
        let now = ContinuousClock.now
        let missed: Int? = entries.withLock { entries in
            if let entry = entries[key], entry.noticedAt.duration(to: now) < interval {
                entries[key]?.since += 1
                return nil
            }
            let missed = entries[key]?.since ?? 0
            if entries.count >= Self.maximumKinds {
                entries = entries.filter { $0.value.noticedAt.duration(to: now) < interval }
                // A flood of new kinds: the ones already noticed stand for it.
                guard entries.count < Self.maximumKinds else { return nil }
            }
            entries[key] = Entry(noticedAt: now)
            return missed
        }
        guard let missed else { return }
        logger.notice(message, metadata: metadata().merging(["hits unlogged before": "\(missed)"]) { $1 })
    }
}
