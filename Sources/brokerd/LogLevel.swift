import FoundationEssentials
import Logging

/// The least severe level brokerd logs: `--log-level`, else `TOKENBROKER_LOG_LEVEL`, else `info`.
/// `debug` adds a line per failed request (its op, account and the error its client got).
enum LogLevel {
    static let variable = "TOKENBROKER_LOG_LEVEL"
    static let standard = Logger.Level.info

    /// The level `option` or `environment` asks for; throws if it names no level.
    static func level(option: String?, environment: [String: String]) throws -> Logger.Level {
        guard let text = option ?? environment[variable] else { return standard }
        guard let level = Logger.Level(rawValue: text) else {
            throw LogLevelError(
                description: "the log level (--log-level or \(variable)) must be one of "
                    + Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))
        }
        return level
    }
}

/// `--log-level` or `TOKENBROKER_LOG_LEVEL` names no level (its value is not repeated).
struct LogLevelError: Error, CustomStringConvertible {
    let description: String
}
