import Foundation
import BrokerProtocol
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

    /// Reads the file at `path`; a missing file gives the defaults and no accounts.
    public static func load(path: String) throws -> BrokerConfiguration {
        guard let data = FileManager.default.contents(atPath: path) else {
            if FileManager.default.fileExists(atPath: path) { throw ConfigError(description: "cannot read \(path)") }
            return BrokerConfiguration()
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw ConfigError(description: "\(path) is not UTF-8 text")
        }
        return try parse(text, path: path)
    }

    static func parse(_ text: String, path: String) throws -> BrokerConfiguration {
        let table: TOMLTable
        do {
            table = try TOMLTable(string: text)
        } catch let error as TOMLParseError {
            throw ConfigError(description: "\(path) line \(error.source.begin.line): \(error.description)")
        }
        for key in table.keys where key != "broker" && key != "accounts" {
            throw ConfigError(description: "\(path): unknown table or key \"\(key)\" (known: [broker], [accounts.NAME])")
        }
        return BrokerConfiguration(
            settings: try settings(table["broker"], path: path), accounts: try accounts(table["accounts"], path: path))
    }

    private static func settings(_ value: (any TOMLValueConvertible)?, path: String) throws -> BrokerSettings {
        var settings = BrokerSettings()
        guard let value else { return settings }
        guard let brokerTable = value.table else {
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

    /// Keys an `[accounts.NAME]` table may hold: provider settings only, never a secret.
    static let accountKeys: Set<String> = [
        "kind", "token_endpoint", "issuer", "client_id", "client_auth", "scope", "method", "endpoint", "timezone",
        "command", "revocation_endpoint",
    ]

    private static func accounts(_ value: (any TOMLValueConvertible)?, path: String) throws -> [String: ProviderSpec] {
        guard let value else { return [:] }
        guard let accounts = value.table else {
            throw ConfigError(description: "\(path): \"accounts\" must hold [accounts.NAME] tables")
        }
        var result: [String: ProviderSpec] = [:]
        for name in accounts.keys {
            guard let account = accounts[name]?.table else {
                throw ConfigError(description: "\(path): accounts.\(name) must be a table")
            }
            for key in account.keys where !accountKeys.contains(key) {
                let secret = ["client_secret", "refresh_token", "refresh_url", "access_token"].contains(key)
                throw ConfigError(
                    description: secret
                        ? "\(path): accounts.\(name).\(key) is a secret; a config file never holds one (push it with brokerctl set-tokens)"
                        : "\(path): unknown key accounts.\(name).\(key)")
            }
            func string(_ key: String) throws -> String? {
                guard let value = account[key] else { return nil }
                guard let text = value.string else {
                    throw ConfigError(description: "\(path): accounts.\(name).\(key) must be a string")
                }
                return text
            }
            guard let kind = try string("kind") else {
                throw ConfigError(description: "\(path): accounts.\(name) needs a kind")
            }
            var spec = ProviderSpec(
                kind: kind, tokenEndpoint: try string("token_endpoint"), issuer: try string("issuer"),
                clientID: try string("client_id"), clientAuth: try string("client_auth"), scope: try string("scope"))
            spec.revocationEndpoint = try string("revocation_endpoint")
            spec.method = try string("method")
            spec.endpoint = try string("endpoint")
            spec.timezone = try string("timezone")
            if let command = account["command"] {
                guard let array = command.array else {
                    throw ConfigError(description: "\(path): accounts.\(name).command must be an array of strings")
                }
                spec.command = try (0..<array.count).map { index in
                    guard let text = array[index].string else {
                        throw ConfigError(description: "\(path): accounts.\(name).command must be an array of strings")
                    }
                    return text
                }
            }
            result[name] = spec
        }
        return result
    }
}

/// What `broker.toml` says: engine settings and declared accounts (provider settings only).
public struct BrokerConfiguration: Sendable, Equatable {
    public var settings = BrokerSettings()
    public var accounts: [String: ProviderSpec] = [:]

    public init(settings: BrokerSettings = BrokerSettings(), accounts: [String: ProviderSpec] = [:]) {
        self.settings = settings
        self.accounts = accounts
    }
}
