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
        Self.writeToStandardError(line)
    }

    /// Writes `line` whole (one `write` for a short line, so lines of several threads do not mix).
    private static func writeToStandardError(_ line: String) {
        var line = line
        line.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = write(STDERR_FILENO, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0, errno == EINTR { continue }
                guard written > 0 else { return }
                offset += written
            }
        }
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
