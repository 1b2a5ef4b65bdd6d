import BrokerModel
import BrokerSecrets
import NIOCore
import NIOPosix

/// Sleeps on a timer of NIO's singleton event-loop group rather than through `Task.sleep`.
///
/// brokerd runs Swift concurrency on that group (docs/performance.md, "An idle brokerd sleeps"),
/// so nothing it does starts a libdispatch worker thread. `Task.sleep` would: its wake-up is
/// delivered on one, and the first such thread arms libdispatch's workqueue monitor, which then
/// wakes the process once a second for the rest of its life.
public enum EventLoopSleep {
    /// The longest single wait; a longer one returns at this point (callers look at the time again).
    package static let longest: Duration = .seconds(86_400 * 365)

    /// Returns once `duration` has passed; throws `CancellationError` if the task is cancelled first.
    public static func sleep(for duration: Duration) async throws {
        let bounded = min(max(duration, .zero), longest).components
        let nanoseconds = bounded.seconds * 1_000_000_000 + bounded.attoseconds / 1_000_000_000
        let scheduled = MultiThreadedEventLoopGroup.singleton.any().scheduleTask(in: .nanoseconds(nanoseconds)) {}
        try await withTaskCancellationHandler {
            do {
                try await scheduled.futureResult.get()
            } catch {
                throw CancellationError()
            }
        } onCancel: {
            scheduled.cancel()
        }
    }

    /// Returns at `deadline` (at once if it has passed); throws `CancellationError` if the task
    /// is cancelled first.
    public static func sleep(until deadline: ContinuousClock.Instant) async throws {
        try await sleep(for: ContinuousClock.now.duration(to: deadline))
    }
}
