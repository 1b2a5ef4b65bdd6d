import Foundation
import TOMLKit

/// A config file problem; the message names the file and, where it can, the line.
public struct ConfigError: Error, CustomStringConvertible, Sendable {
    public let description: String
}

/// Reads `broker.toml`. A missing file means defaults; a broken one is an error that
/// names the line, so the running configuration can stay in force.
public enum ConfigFile {
    /// Every key of the `[broker]` table and the setting it controls.
    static var keys: [(String, WritableKeyPath<BrokerSettings, Double>)] { [
        ("refresh_fraction", \.refreshFraction), ("refresh_jitter", \.refreshJitter),
        ("refresh_floor", \.refreshFloor),
        ("minimum_refresh_interval", \.minimumRefreshInterval),
        ("overdue_threshold", \.overdueThreshold), ("overdue_spread", \.overdueSpread), ("backoff_base", \.backoffBase), ("backoff_cap", \.backoffCap),
        ("connect_timeout", \.connectTimeout), ("request_timeout", \.requestTimeout),
        ("default_lifetime", \.defaultLifetime), ("event_buffer", \.eventBuffer), ("default_min_ttl", \.defaultMinTTL),
    ] }

    public static func load(path: String) throws -> BrokerSettings {
        guard let data = FileManager.default.contents(atPath: path) else {
            if FileManager.default.fileExists(atPath: path) { throw ConfigError(description: "cannot read \(path)") }
            return BrokerSettings()
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw ConfigError(description: "\(path) is not UTF-8 text")
        }
        return try parse(text, path: path)
    }

    static func parse(_ text: String, path: String) throws -> BrokerSettings {
        let table: TOMLTable
        do {
            table = try TOMLTable(string: text)
        } catch let error as TOMLParseError {
            throw ConfigError(description: "\(path) line \(error.source.begin.line): \(error.description)")
        }
        var settings = BrokerSettings()
        for key in table.keys where key != "broker" {
            throw ConfigError(description: "\(path): unknown table or key \"\(key)\" (known: [broker])")
        }
        guard let broker = table["broker"] else { return settings }
        guard let brokerTable = broker.table else {
            throw ConfigError(description: "\(path): \"broker\" must be a table")
        }
        for key in brokerTable.keys {
            guard let (_, setting) = keys.first(where: { $0.0 == key }) else {
                throw ConfigError(
                    description: "\(path): unknown key broker.\(key) (known: \(keys.map(\.0).joined(separator: ", ")))")
            }
            let value = brokerTable[key]
            guard let number = value?.double ?? value?.int.map(Double.init), number >= 0, number.isFinite else {
                throw ConfigError(description: "\(path): broker.\(key) must be a number of zero or more")
            }
            settings[keyPath: setting] = number
        }
        return settings
    }
}
