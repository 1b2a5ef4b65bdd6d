import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// Wall-clock time, injectable so tests can jump it. Expiry is always judged by it, and the
/// engine's own waits (the delay after a wrong passphrase) are measured on it.
public protocol WallClock: Sendable {
    func now() -> Date
    /// Returns once `duration` has passed on this clock; never cut short.
    func sleep(for duration: Duration) async
}

/// The real system clock.
public struct SystemClock: WallClock {
    public init() {}

    public func now() -> Date { Date() }

    public func sleep(for duration: Duration) async {
        // Run as a task of its own, so that the caller's cancellation does not shorten it.
        await Task { try? await EventLoopSleep.sleep(for: duration) }.value
    }
}
