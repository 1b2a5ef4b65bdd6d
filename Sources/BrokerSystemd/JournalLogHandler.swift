import Foundation
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Logs one line per event to stderr with a syslog priority prefix (`<3>` …), which
/// journald turns into the entry's level. Metadata is printed as `key=value`.
public struct JournalLogHandler: LogHandler {
    public var logLevel: Logger.Level = .info
    public var metadata: Logger.Metadata = [:]
    private let label: String

    public init(label: String) { self.label = label }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { $1 }
        let fields = merged.sorted { $0.key < $1.key }.map { " \($0.key)=\($0.value)" }.joined()
        let line = "<\(Self.priority(event.level))>\(event.message)\(fields)\n"
        FileHandle.standardError.write(Data(line.utf8))
    }

    /// The syslog priority of a log level (RFC 5424 severities).
    static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }
}
