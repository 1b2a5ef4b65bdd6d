@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing

/// docs/configuration.md names every key `broker.toml` may hold, and each engine setting's
/// row gives the default the broker uses: a key added to the reader without its line in the
/// reference, or a default changed without it, fails here.
@Suite struct ConfigurationReferenceTests {
    /// The reference's text, found from this file up to the package's root.
    static func reference() throws -> String {
        var directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while !FileManager.default.fileExists(atPath: directory.appendingPathComponent("Package.swift").path) {
            let parent = directory.deletingLastPathComponent()
            try #require(parent.path != directory.path, "no Package.swift above \(#filePath)")
            directory = parent
        }
        let path = directory.appendingPathComponent("docs/configuration.md").path
        return try String(contentsOfFile: path, encoding: .utf8)
    }

    /// The cells of the table row that starts with `` `key` ``, trimmed.
    static func row(of key: String, in text: String) -> [String]? {
        text.split(separator: "\n").first { $0.hasPrefix("| `\(key)` |") }.map { line in
            line.split(separator: "|").map { $0.trimmingSpaces() }
        }
    }

    @Test func everyEngineSettingHasARowWithItsDefault() throws {
        let text = try Self.reference()
        let defaults = BrokerSettings()
        for (key, setting, _) in ConfigFile.keys {
            let row = try #require(Self.row(of: key, in: text), "docs/configuration.md has no row for \(key)")
            let value = defaults[keyPath: setting]
            let written = value == value.rounded() ? String(Int(value)) : String(value)
            #expect(row.count > 1 && row[1] == written, "\(key): the reference says \(row), the default is \(written)")
        }
    }

    @Test func everyOtherKeyIsNamed() throws {
        let text = try Self.reference()
        let brokerKeys = AccessRules.brokerKeys + ["key", "wlcg_account", "desktop_notifications"]
        let accountKeys = ProviderKinds.fields.filter { !$0.isSecret }.map(\.name) + ["kind", "export_file"]
        let tableKeys = ["executables", "units", "uids", "hosts", "registries", "username", "allow_http"]
        for key in brokerKeys + accountKeys + tableKeys {
            #expect(text.contains("`\(key)`"), "docs/configuration.md does not name \(key)")
        }
        for table in AccountBridges.tableKeys.sorted() + ["access"] {
            #expect(
                text.contains("`[accounts.NAME.\(table)]`"), "docs/configuration.md has no [accounts.NAME.\(table)]")
        }
    }
}
