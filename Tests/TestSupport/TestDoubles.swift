import BrokerCore
import Foundation
import Logging
import Synchronization

/// Wall-clock time that only moves when a test says so.
public final class TestClock: WallClock {
    private let current: Mutex<Date>

    public init(_ start: Date = Date(timeIntervalSince1970: 1_795_422_600)) { current = Mutex(start) }

    public func now() -> Date { current.withLock { $0 } }

    public func advance(by seconds: TimeInterval) { current.withLock { $0 = $0.addingTimeInterval(seconds) } }
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
