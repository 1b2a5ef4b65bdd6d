import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// A point a login waits for (its end, the next poll), on the broker's clock: the clock every
/// expiry is judged by, which tests move by hand, so a login's waits follow it too.
package struct LoginDeadline: Sendable {
    package let date: Date
    package let clock: any WallClock

    package init(at date: Date, on clock: any WallClock) {
        self.date = date
        self.clock = clock
    }

    /// The point `seconds` from now on `clock`.
    package init(in seconds: TimeInterval, on clock: any WallClock) {
        self.init(at: clock.now().addingTimeInterval(seconds), on: clock)
    }

    /// Seconds left until it (negative once it has passed).
    package var remaining: TimeInterval { date.timeIntervalSince(clock.now()) }

    /// Returns at the deadline, or as soon as the task is cancelled (the clock's own sleep cannot
    /// be cut short, so it is left to end unobserved); whether the deadline was reached.
    package func reached() async -> Bool {
        let seconds = remaining
        if seconds > 0 {
            let (ended, end) = AsyncStream.makeStream(of: Void.self)
            Task { [clock] in
                await clock.sleep(for: .seconds(seconds))
                end.finish()
            }
            // Ends when the sleep does, or at once when this task is cancelled.
            for await _ in ended {}
        }
        return !Task.isCancelled
    }
}
