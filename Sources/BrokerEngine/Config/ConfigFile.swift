import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// A config file problem; the message names the file and, where it can, the line.
public struct ConfigError: Error, CustomStringConvertible, Sendable {
    public let description: String
}

/// Reads `broker.toml`. A missing file means defaults; a broken one is an error that
/// names the line, so the running configuration can stay in force.
public enum ConfigFile {
    /// Most unread events a subscriber may be allowed (`event_buffer`).
    public static let maximumEventBuffer = 1_000_000

    /// Every key of the `[broker]` table, the setting it controls and the values it accepts.
    package static var keys: [(String, WritableKeyPath<BrokerSettings, Double>, ClosedRange<Double>)] {
        let day = 86_400.0
        return [
            ("refresh_fraction", \.refreshFraction, 0...0.9), ("refresh_jitter", \.refreshJitter, 0...0.5),
            ("refresh_floor", \.refreshFloor, 0...day),
            ("minimum_refresh_interval", \.minimumRefreshInterval, 0.1...day),
            ("overdue_threshold", \.overdueThreshold, 0...day), ("overdue_spread", \.overdueSpread, 0...day),
            ("backoff_base", \.backoffBase, 0.1...day), ("backoff_cap", \.backoffCap, 0.1...7 * day),
            ("outage_probe_interval", \.outageProbeInterval, 0.1...day),
            ("connect_timeout", \.connectTimeout, 0.001...3600), ("request_timeout", \.requestTimeout, 0.001...3600),
            ("default_lifetime", \.defaultLifetime, 1...Bounds.maximumLifetime),
            ("event_buffer", \.eventBuffer, 1...Double(maximumEventBuffer)),
            ("default_min_ttl", \.defaultMinTTL, 0...Bounds.maximumLifetime),
            ("line_timeout", \.lineTimeout, 0.1...3600),
            ("idle_connection_timeout", \.idleConnectionTimeout, 0.1...day),
        ]
    }

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

    package static func parse(_ text: String, path: String) throws -> BrokerConfiguration {
        let table: TOMLTable
        do {
            table = try TOMLTable(parsing: text)
        } catch {
            throw ConfigError(description: "\(path) line \(error.line): \(error)")
        }
        for key in table.keys where !["broker", "accounts", "fleet"].contains(key) {
            throw ConfigError(
                description: "\(path): unknown table or key \"\(key)\" (known: [broker], [accounts.NAME], [fleet])")
        }
        let settings = try settings(table["broker"], path: path, text: text)
        let fleet = try FleetSettings.parse(table["fleet"], settings: settings, path: path)
        try fleet?.checkLease(settings: settings, path: path)
        let configuration = BrokerConfiguration(
            settings: settings,
            accounts: try accounts(table["accounts"], path: path),
            access: try AccessRules.parse(
                broker: table["broker"]?.table, accounts: table["accounts"]?.table, path: path),
            vaultKey: try vaultKey(table["broker"]?.table?["key"], path: path, text: text),
            exportFiles: try exportFiles(table["accounts"]?.table, path: path),
            wlcgAccount: try wlcgAccount(table["broker"]?.table?["wlcg_account"], path: path),
            bridges: try AccountBridges.parse(accounts: table["accounts"]?.table, path: path), fleet: fleet)
        try checkNoTokenFileAroundRules(configuration, path: path)
        try checkNoTokenFileOfDPoPAccounts(configuration, path: path)
        return configuration
    }

    /// Refuses a token file of an account whose tokens are DPoP-bound (`dpop`): a program
    /// reading the file could not make the proof each request needs (docs/dpop.md).
    private static func checkNoTokenFileOfDPoPAccounts(_ configuration: BrokerConfiguration, path: String) throws {
        let bound = configuration.accounts.filter { $0.value.fields["dpop"] != nil }.keys
        let why = "its tokens are DPoP-bound, and a program reading a file cannot make the proof each request needs"
        if let name = bound.sorted().first(where: { configuration.exportFiles[$0] != nil }) {
            throw ConfigError(description: "\(path): accounts.\(name).export_file is refused: \(why)")
        }
        if let name = configuration.wlcgAccount, bound.contains(name) {
            throw ConfigError(description: "\(path): broker.wlcg_account = \"\(name)\" is refused: \(why)")
        }
    }

    /// Refuses a token file (`export_file`, `wlcg_account`) of an account whose access rule names
    /// programs: every process of the user can read the file, so the rule would hold only on
    /// the socket (docs/bridges.md, "Token files kept fresh").
    private static func checkNoTokenFileAroundRules(_ configuration: BrokerConfiguration, path: String) throws {
        let guarded = configuration.access.accounts.filter(\.value.namesPrograms).keys
        let why =
            "every process of yours can read the token file, so the rule's executables and units would not "
            + "hold; remove one of the two"
        if let name = guarded.sorted().first(where: { configuration.exportFiles[$0] != nil }) {
            throw ConfigError(
                description: "\(path): accounts.\(name).export_file is refused beside accounts.\(name).access: \(why)")
        }
        if let name = configuration.wlcgAccount, guarded.contains(name) {
            throw ConfigError(
                description:
                    "\(path): broker.wlcg_account = \"\(name)\" is refused beside accounts.\(name).access: \(why)")
        }
    }

    /// The longest `export_file` path accepted, in bytes (below `PATH_MAX`).
    package static let maximumExportPathLength = 4095

    /// Each `[accounts.NAME] export_file`: an absolute path of a file (not a directory name),
    /// without NUL, below 4096 bytes.
    private static func exportFiles(_ accounts: TOMLTable?, path: String) throws -> [String: String] {
        var files: [String: String] = [:]
        for name in accounts?.keys ?? [] {
            guard let value = accounts?[name]?.table?["export_file"] else { continue }
            let place = "\(path): accounts.\(name).export_file"
            guard let file = value.string, file.hasPrefix("/"), !file.hasSuffix("/"), !file.contains("\0"),
                file.utf8.count <= maximumExportPathLength,
                !["/.", "/.."].contains(where: { file.hasSuffix($0) })
            else {
                throw ConfigError(
                    description:
                        "\(place) must be the absolute path of a file, at most \(maximumExportPathLength) bytes")
            }
            _ = try accountName(name, place: place)
            files[name] = file
        }
        return files
    }

    /// `[broker] wlcg_account`: the account whose token the WLCG bearer token file holds.
    private static func wlcgAccount(_ value: TOMLValue?, path: String) throws -> String? {
        guard let value else { return nil }
        let place = "\(path): broker.wlcg_account"
        guard let name = value.string else { throw ConfigError(description: "\(place) must be an account name") }
        return try accountName(name, place: place)
    }

    private static func accountName(_ name: String, place: String) throws -> String {
        do {
            return try AccountName(name).rawValue
        } catch {
            throw ConfigError(description: "\(place): \(error)")
        }
    }

    /// `[broker] key`: `"keyfile"` (the default) or `"passphrase"`.
    private static func vaultKey(_ value: TOMLValue?, path: String, text: String) throws -> VaultKeyMode {
        guard let value else { return .keyFile }
        guard let mode = value.string.flatMap(VaultKeyMode.init(rawValue:)) else {
            let place = line(of: "key", in: text).map { " line \($0)" } ?? ""
            throw ConfigError(description: "\(path)\(place): broker.key must be \"keyfile\" or \"passphrase\"")
        }
        return mode
    }

    private static func settings(_ value: TOMLValue?, path: String, text: String) throws
        -> BrokerSettings
    {
        var settings = BrokerSettings()
        guard let value else { return settings }
        guard let brokerTable = value.table else {
            throw ConfigError(description: "\(path): \"broker\" must be a table")
        }
        let otherKeys = AccessRules.brokerKeys + ["key", "wlcg_account", "desktop_notifications"]
        for key in brokerTable.keys where !otherKeys.contains(key) {
            guard let (_, setting, range) = keys.first(where: { $0.0 == key }) else {
                throw ConfigError(
                    description:
                        "\(path): unknown key broker.\(key) (known: \((keys.map(\.0) + otherKeys).joined(separator: ", ")))"
                )
            }
            let value = brokerTable[key]
            guard let number = value?.double ?? value?.int.map(Double.init), range.contains(number) else {
                let place = line(of: key, in: text).map { " line \($0)" } ?? ""
                throw ConfigError(
                    description: "\(path)\(place): broker.\(key) must be a number from \(Self.text(range.lowerBound)) "
                        + "to \(Self.text(range.upperBound))")
            }
            settings[keyPath: setting] = number
        }
        if let value = brokerTable["desktop_notifications"] {
            guard case .boolean(let enabled) = value else {
                let place = line(of: "desktop_notifications", in: text).map { " line \($0)" } ?? ""
                throw ConfigError(description: "\(path)\(place): broker.desktop_notifications must be true or false")
            }
            settings.desktopNotifications = enabled
        }
        // Beyond this an account would always be due, and refresh as fast as it is allowed to.
        guard settings.refreshFraction + settings.refreshJitter <= 0.9 else {
            let place = line(of: "refresh_jitter", in: text).map { " line \($0)" } ?? ""
            throw ConfigError(description: "\(path)\(place): refresh_fraction + refresh_jitter must be at most 0.9")
        }
        return settings
    }

    /// `number` as a person writes it: `86400`, `0.5`.
    private static func text(_ number: Double) -> String {
        number == number.rounded() && abs(number) < 1e15 ? String(Int(number)) : String(number)
    }

    /// The line (1-based) of the first `key = ...` in `text`, for messages (the TOML reader
    /// keeps no positions for values).
    package static func line(of key: String, in text: String) -> Int? {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        let index = lines.firstIndex { line in
            let trimmed = line.drop { $0 == " " || $0 == "\t" }
            guard trimmed.hasPrefix(key) else { return false }
            return trimmed.dropFirst(key.count).drop { $0 == " " || $0 == "\t" }.first == "="
        }
        return index.map { $0 + 1 }
    }

    /// Secrets an `[accounts.NAME]` table must not hold, beyond the secret fields of provider kinds.
    package static let tokenSecrets: Set<String> = ["refresh_token", "refresh_url", "access_token"]

    /// Reads each `[accounts.NAME]` table into a provider object: its `kind`, and any field of
    /// a provider kind with that field's type (provider settings only, never a secret). A table
    /// holding only `access` gives an account added at run time its rule without declaring it.
    private static func accounts(_ value: TOMLValue?, path: String) throws -> [String: ProviderSpec] {
        guard let value else { return [:] }
        guard let accounts = value.table else {
            throw ConfigError(description: "\(path): \"accounts\" must hold [accounts.NAME] tables")
        }
        var result: [String: ProviderSpec] = [:]
        for name in accounts.keys {
            guard let account = accounts[name]?.table else {
                throw ConfigError(description: "\(path): accounts.\(name) must be a table")
            }
            // Tables and keys of other settings only: they give an account added at run time its settings.
            let otherSettings = AccountBridges.tableKeys.union(["access", "export_file"])
            if Set(account.keys).isSubset(of: otherSettings) { continue }
            guard let kindValue = account["kind"] else {
                throw ConfigError(description: "\(path): accounts.\(name) needs a kind")
            }
            guard let kind = kindValue.string else {
                throw ConfigError(description: "\(path): accounts.\(name).kind must be a string")
            }
            var spec = ProviderSpec(kind: kind)
            for key in account.keys where key != "kind" && !otherSettings.contains(key) {
                let field = ProviderKinds.fields.first { $0.name == key }
                guard let field, !field.isSecret else {
                    let secret = field?.isSecret == true || tokenSecrets.contains(key)
                    throw ConfigError(
                        description: secret
                            ? "\(path): accounts.\(name).\(key) is a secret; a config file never holds one (push it with brokerctl set-tokens)"
                            : "\(path): unknown key accounts.\(name).\(key)")
                }
                spec[key] = try fieldValue(account[key], field, place: "\(path): accounts.\(name).\(key)")
            }
            result[name] = spec
        }
        return result
    }

    /// The TOML value of a provider field as the JSON value a `provider` object would give.
    private static func fieldValue(_ value: TOMLValue?, _ field: ProviderField, place: String) throws
        -> JSONValue
    {
        switch field.type {
        case .text:
            guard let text = value?.string else { throw ConfigError(description: "\(place) must be a string") }
            return .string(text)
        case .texts:
            guard let array = value?.array else {
                throw ConfigError(description: "\(place) must be an array of strings")
            }
            return .array(
                try (0..<array.count).map { index in
                    guard let text = array[index].string else {
                        throw ConfigError(description: "\(place) must be an array of strings")
                    }
                    return .string(text)
                })
        }
    }
}

/// What `broker.toml` says: engine settings, declared accounts (provider settings only), who
/// may use them and where they are offered to git and docker, and how the vault key is
/// obtained (read at start only).
public struct BrokerConfiguration: Sendable, Equatable {
    public var settings = BrokerSettings()
    public var accounts: [String: ProviderSpec] = [:]
    public var access = AccessRules()
    public var vaultKey = VaultKeyMode.keyFile
    /// The file each account's token is kept in (`export_file`), by account.
    public var exportFiles: [String: String] = [:]
    /// The account whose token the WLCG bearer token file (`$XDG_RUNTIME_DIR/bt_u$UID`) holds.
    public var wlcgAccount: String?
    public var bridges: [String: AccountBridges] = [:]
    /// The fleet's shared store (`[fleet]`); `nil`: every account is local. Read at start only.
    public var fleet: FleetSettings?

    public init(
        settings: BrokerSettings = BrokerSettings(), accounts: [String: ProviderSpec] = [:],
        access: AccessRules = AccessRules(), vaultKey: VaultKeyMode = .keyFile, exportFiles: [String: String] = [:],
        wlcgAccount: String? = nil, bridges: [String: AccountBridges] = [:], fleet: FleetSettings? = nil
    ) {
        self.settings = settings
        self.accounts = accounts
        self.access = access
        self.vaultKey = vaultKey
        self.exportFiles = exportFiles
        self.wlcgAccount = wlcgAccount
        self.bridges = bridges
        self.fleet = fleet
    }
}
