@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// The registry of provider kinds: each kind named once, every stored record of today's vaults
/// still read, and the `provider` object and config tables checked with the kinds' own fields.
@Suite struct ProviderRegistryTests {
    @Test func everyKindHasOneNameAndOneStoredName() {
        let names = ProviderKinds.all.map { $0.kind }
        let storedNames = ProviderKinds.all.map { $0.storedName }
        #expect(names == ["oauth2", "refresh_url", "sliding", "exec", "file", "static"])
        #expect(Set(storedNames).count == storedNames.count)
        for kind in ProviderKinds.all {
            #expect(ProviderKinds.named(kind.kind) == kind)
            #expect(ProviderKinds.stored(as: kind.storedName) == kind)
        }
        #expect(ProviderKinds.named("refreshURL") == nil, "the stored name is not a wire name")
    }

    /// Records of every kind as the code before the registry encoded them (its synthesized
    /// `Codable` of the `ProviderConfig` enum, `sortedKeys`), byte for byte.
    static let recordsSavedBeforeTheRegistry = #"""
        [{"lastRefreshAt":816692800,"name":"o","needsLogin":false,"provider":{"oauth2":{"_0":{"clientAuth":"client_secret_basic","clientID":"cli","revocationEndpoint":"https:\/\/idp.example\/revoke","scope":"api","tokenEndpoint":"https:\/\/idp.example\/token"}}},"secrets":{"clientSecret":"cs-o","refreshExpiresAt":816779200,"refreshToken":"rt-o"},"token":{"expiresAt":816696400,"obtainedAt":816692800,"type":"Bearer","value":"at-o"}},{"lastRefreshAt":816692800,"name":"r","needsLogin":false,"provider":{"refreshURL":{"_0":{"method":"POST"}}},"secrets":{"refreshURL":"https:\/\/api.example\/refresh\/abc"},"token":{"expiresAt":816696400,"obtainedAt":816692800,"type":"Bearer","value":"at-r"}},{"lastRefreshAt":816692800,"name":"s","needsLogin":false,"provider":{"sliding":{"_0":{"endpoint":"https:\/\/idp.example\/refresh","timeZone":"Europe\/Berlin"}}},"secrets":{"refreshExpiresAt":816779200,"refreshToken":"rt-s"},"token":{"expiresAt":816696400,"obtainedAt":816692800,"type":"Bearer","value":"at-s"}},{"lastRefreshAt":816692800,"name":"e","needsLogin":false,"provider":{"exec":{"_0":{"command":["\/usr\/bin\/get-token","--profile","work"]}}},"secrets":{},"token":{"expiresAt":816696400,"obtainedAt":816692800,"type":"Bearer","value":"at-e"}},{"lastRefreshAt":816692800,"name":"t","needsLogin":false,"provider":{"static":{}},"secrets":{},"token":{"expiresAt":816696400,"obtainedAt":816692800,"type":"Bearer","value":"at-t"}}]
        """#

    @Test func recordsSavedBeforeTheRegistryStillLoadAndAreWrittenTheSameWay() throws {
        let records = try JSONDecoder().decode(
            [AccountRecord].self, from: Data(Self.recordsSavedBeforeTheRegistry.utf8))
        #expect(
            records.map(\.provider) == [
                ProviderConfig(
                    OAuth2Settings(
                        tokenEndpoint: URL(string: "https://idp.example/token"), clientID: "cli",
                        clientAuth: .clientSecretBasic, scope: "api",
                        revocationEndpoint: URL(string: "https://idp.example/revoke"))),
                ProviderConfig(RefreshURLSettings(method: .post)),
                ProviderConfig(
                    SlidingSettings(endpoint: URL(string: "https://idp.example/refresh")!, timeZone: "Europe/Berlin")),
                ProviderConfig(ExecSettings(command: ["/usr/bin/get-token", "--profile", "work"])),
                ProviderConfig(StaticSettings()),
            ])
        #expect(records.map(\.provider.kind) == ["oauth2", "refresh_url", "sliding", "exec", "static"])
        #expect(records.first?.secrets.clientSecret == "cs-o")
        #expect(records[1].secrets.refreshURL == "https://api.example/refresh/abc")

        // Written back, every kind keeps its shape; `static` gains an empty `_0`, which the
        // code before the registry reads too (it ignores the keys of a case without values).
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let rewritten = String(decoding: try encoder.encode(records), as: UTF8.self)
        #expect(
            rewritten
                == Self.recordsSavedBeforeTheRegistry.replacingOccurrences(
                    of: #""static":{}"#, with: #""static":{"_0":{}}"#))
    }

    @Test(arguments: [
        #"{"kerberos":{"_0":{}}}"#, #"{}"#, #"{"static":{},"exec":{"_0":{"command":["/bin/true"]}}}"#,
        #"{"file":{"_0":{"path":7}}}"#,
    ])
    func unreadableStoredSettingsAreRefused(json: String) {
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(ProviderConfig.self, from: Data(json.utf8)) }
    }

    @Test func theWireObjectKeepsEveryFieldAsSent() throws {
        let line = #"{"kind":"file","path":"\/tmp\/t.json","future":{"a":[1,true,null,"x"]}}"#
        let spec = try Wire.makeDecoder().decode(ProviderSpec.self, from: Data(line.utf8))
        #expect(spec.kind == "file")
        #expect(spec["path"] == "/tmp/t.json")
        #expect(spec["future"] == .object(["a": [.number(1), .bool(true), .null, "x"]]))
        let again = try Wire.makeDecoder().decode(ProviderSpec.self, from: Wire.makeEncoder().encode(spec))
        #expect(again == spec)
        for refused in [#"{"path":"/tmp/t.json"}"#, #"{"kind":5}"#, #"["file"]"#] {
            #expect(throws: DecodingError.self) {
                try Wire.makeDecoder().decode(ProviderSpec.self, from: Data(refused.utf8))
            }
        }
    }

    // MARK: config file

    @Test(arguments: [
        ("[accounts.a]\nkind = \"file\"\npath = 5\n", "accounts.a.path must be a string"),
        ("[accounts.a]\nkind = \"exec\"\ncommand = \"/bin/true\"\n", "accounts.a.command must be an array of strings"),
        ("[accounts.a]\nkind = \"exec\"\ncommand = [\"/bin/true\", 1]\n", "array of strings"),
        ("[accounts.a]\nkind = \"file\"\npaht = \"/x\"\n", "unknown key accounts.a.paht"),
        ("[accounts.a]\nkind = \"oauth2\"\nclient_secret = \"s3cret\"\n", "is a secret"),
        ("[accounts.a]\nkind = \"static\"\nrefresh_token = \"rt\"\n", "is a secret"),
        ("[accounts.a]\npath = \"/x\"\n", "needs a kind"),
        ("[accounts.a]\nkind = 3\n", "kind must be a string"),
    ])
    func badAccountTablesAreRefused(text: String, mentions: String) {
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text, path: "/cfg/broker.toml") }
        #expect(error?.description.contains(mentions) == true, "\(error?.description ?? "")")
        #expect(error?.description.contains("s3cret") == false)
    }
}
