import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Waiting, with a deadline, for a condition that gives no event to wait for (a server coming
/// up, a file appearing, a count reaching a number): the one place the tests sleep while they
/// look. `blocking` is for threads of their own; tasks use `eventually`.
public enum Poll {
    /// Whether `condition` holds within `timeout` seconds, looked at every `interval`. It
    /// blocks the calling thread: call it from a thread of its own (or through `onOwnThread`),
    /// never from a task.
    public static func blocking(
        timeout: TimeInterval, every interval: Duration = .milliseconds(10), _ condition: () throws -> Bool
    ) rethrows -> Bool {
        let deadline = ContinuousClock.now + .milliseconds(Int64(timeout * 1000))
        while true {
            if try condition() { return true }
            guard ContinuousClock.now < deadline else { return false }
            let parts = interval.components
            usleep(UInt32(parts.seconds * 1_000_000 + parts.attoseconds / 1_000_000_000_000))
        }
    }
}

/// Looks at `condition` every 25 ms until it holds or `timeout` seconds pass; returns whether
/// it held. The task sleeps between looks, leaving its thread to other tasks.
public func eventually(timeout: TimeInterval = 15, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(25))
    }
    return try await condition()
}
