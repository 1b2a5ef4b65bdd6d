import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Foundation
import Logging
import Synchronization

/// Wall-clock time that only moves when a test says so; a `sleep` on it returns when `advance`
/// reaches its end.
public final class TestClock: WallClock {
    private struct State {
        var now: Date
        var sleepers: [(until: Date, wake: CheckedContinuation<Void, Never>)] = []
        /// Every duration asked of `sleep`, in order.
        var asked: [Duration] = []
        /// Who waits in `sleepers(where:)`, for what.
        var watchers:
            [(ready: @Sendable (_ ends: [Date], _ now: Date) -> Bool, wake: CheckedContinuation<Void, Never>)] =
                []

        /// Takes the watchers whose condition now holds.
        mutating func readyWatchers() -> [CheckedContinuation<Void, Never>] {
            let ends = sleepers.map(\.until)
            let now = now
            let ready = watchers.filter { $0.ready(ends, now) }.map(\.wake)
            watchers.removeAll { $0.ready(ends, now) }
            return ready
        }
    }
    private let state: Mutex<State>

    public init(_ start: Date = Date(timeIntervalSince1970: 1_795_422_600)) { state = Mutex(State(now: start)) }

    public func now() -> Date { state.withLock { $0.now } }

    public func advance(by seconds: TimeInterval) {
        let (due, reached) = state.withLock { state in
            state.now = state.now.addingTimeInterval(seconds)
            let now = state.now
            let due = state.sleepers.filter { $0.until <= now }
            state.sleepers.removeAll { $0.until <= now }
            return (due, state.readyWatchers())
        }
        for sleeper in due { sleeper.wake.resume() }
        for watcher in reached { watcher.resume() }
    }

    public func sleep(for duration: Duration) async {
        await withCheckedContinuation { (wake: CheckedContinuation<Void, Never>) in
            let (now, reached) = state.withLock { state in
                state.asked.append(duration)
                let parts = duration.components
                let until = state.now.addingTimeInterval(Double(parts.seconds) + Double(parts.attoseconds) / 1e18)
                guard until > state.now else { return (true, [CheckedContinuation<Void, Never>]()) }
                state.sleepers.append((until, wake))
                return (false, state.readyWatchers())
            }
            if now { wake.resume() }
            for watcher in reached { watcher.resume() }
        }
    }

    /// The durations asked of `sleep` so far, in order.
    public var asked: [Duration] { state.withLock { $0.asked } }

    /// How many `sleep`s wait for `advance`.
    public var sleeping: Int { state.withLock { $0.sleepers.count } }

    /// Returns once at least `count` `sleep`s wait for `advance`.
    public func sleepersReached(_ count: Int) async {
        await sleepers { ends, _ in ends.count >= count }
    }

    /// Waits until a sleep on this clock ends within `seconds` from now, then moves the clock to
    /// the end of the first such sleep, waking it: the test lets the next timed step (a poll)
    /// happen, and no longer sleeps (a login's timeout) end.
    public func advanceToNextWake(within seconds: TimeInterval) async {
        await sleepers { ends, now in ends.contains { $0.timeIntervalSince(now) <= seconds } }
        let next = state.withLock { state in state.sleepers.map(\.until).min().map { $0.timeIntervalSince(state.now) } }
        if let next { advance(by: next) }
    }

    /// Returns once `ready` holds of the ends of the sleeps waiting for `advance` and the time.
    private func sleepers(where ready: @escaping @Sendable (_ ends: [Date], _ now: Date) -> Bool) async {
        await withCheckedContinuation { (wake: CheckedContinuation<Void, Never>) in
            let reached = state.withLock { state in
                guard !ready(state.sleepers.map(\.until), state.now) else { return true }
                state.watchers.append((ready, wake))
                return false
            }
            if reached { wake.resume() }
        }
    }
}

/// Keeps every log line (message and metadata rendered as text) for assertions.
public final class LogRecorder: Sendable {
    public init() {}

    private let lines = Mutex<[String]>([])

    public var all: [String] { lines.withLock { $0 } }

    public func record(_ line: String) { lines.withLock { $0.append(line) } }

    public func logger() -> Logger {
        Logger(label: "test") { label in RecordingLogHandler(recorder: self) }
    }
}

struct RecordingLogHandler: LogHandler {
    let recorder: LogRecorder
    var logLevel: Logger.Level = .trace
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { $1 }
        recorder.record("\(event.level) \(event.message) \(merged.sorted { $0.key < $1.key })")
    }
}
