@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// `VaultJSONReader`, the reader of the vault's plaintext: it gives what `JSONDecoder` gives for
/// every record shape the vault writes (and wrote), in any key order; it keeps what it does not
/// know (a member, byte for byte; an account object it cannot read, whole and damaged) and gives
/// nothing for JSON that is malformed or not the vault's shape (protocol/VAULT.md).
@Suite struct VaultJSONReaderTests {
    /// The snapshot's plaintext shape (`VaultSnapshot.Body`).
    private struct Body: Codable {
        var sequence: UInt64?
        var accounts: [AccountRecord]
    }

    /// Records of every shape: every provider kind, every optional field present and absent,
    /// texts that need escapes (quotes, backslashes, slashes, control characters, non-ASCII).
    private static func records() -> [AccountRecord] {
        let at = Date(timeIntervalSinceReferenceDate: 785_000_000.123_456)
        var full = AccountRecord.sample("full")
        full.loggedOut = false
        full.declared = true
        full.grantedScope = "read write"
        full.fleet = FleetMark(step: .sharing, version: 1, id: "9f2c")
        full.token?.pushed = true
        full.secrets.refreshURL = SecretBytes("https://api.example/refresh/a?b=\"c\"&d=\\e")
        var bare = AccountRecord(
            name: "bare \u{1F511} ü", provider: ProviderConfig(StaticSettings()), secrets: AccountSecrets(),
            token: nil, needsLogin: true, lastError: nil, lastRefreshAt: nil)
        bare.loggedOut = true
        bare.fleet = FleetMark(step: .uncommitted, version: Int64.max - 1)
        let escaped = AccountRecord(
            name: "tab\there \"quoted\" back\\slash", provider: ProviderConfig(RefreshURLSettings(method: .get)),
            secrets: AccountSecrets(refreshURL: SecretBytes("https://r.example/x/\u{7}\u{1F}é\u{1F600}")),
            token: AccessToken(
                value: SecretBytes("line\nbreak/\u{2028}"), type: "Bearer", expiresAt: at.addingTimeInterval(-1e9),
                obtainedAt: at, idToken: nil, scope: nil, pushed: false),
            needsLogin: false, lastError: AccountError(code: "denied", message: "said \"no\"\n", at: at),
            lastRefreshAt: Date(timeIntervalSinceReferenceDate: 0))
        let kinds: [any ProviderSettings] = [
            ExecSettings(command: ["/usr/bin/get-token", "--profile", "work"]),
            SlidingSettings(endpoint: URL(string: "https://idp.example/refresh")!, timeZone: "Europe/Berlin"),
            FileSettings(path: "/run/user/1000/tok.json"),
            RefreshURLSettings(method: .post),
        ]
        let others = kinds.enumerated().map { index, settings in
            AccountRecord(
                name: "kind-\(index)", provider: ProviderConfig(settings), secrets: AccountSecrets(),
                token: AccessToken(
                    value: try! SecretBytes(String(repeating: "x", count: 800)), type: "DPoP",
                    expiresAt: at.addingTimeInterval(Double(index)), obtainedAt: at, idToken: SecretBytes("id"),
                    scope: "s"),
                needsLogin: false, lastError: nil, lastRefreshAt: at)
        }
        return [full, bare, escaped, .sample("same-provider-1"), .sample("same-provider-2")] + others
    }

    @Test func agreesWithJSONDecoderOnEverySnapshotShape() throws {
        for sequence in [nil, 0, 7, UInt64(Int64.max) - 1] as [UInt64?] {
            let plaintext = try JSONEncoder().encode(Body(sequence: sequence, accounts: Self.records()))
            let expected = try JSONDecoder().decode(Body.self, from: plaintext)
            let read = try #require(plaintext.withUnsafeBytes { VaultJSONReader().snapshot($0) })
            #expect(read.generation == expected.sequence)
            #expect(read.contents.accounts.count == expected.accounts.count && read.contents.damaged.isEmpty)
            // Compared record by record and outside `#expect`, whose message would print them.
            let equal = zip(read.contents.accounts, expected.accounts).map { $0 == $1 }
            #expect(equal.allSatisfy { $0 }, "records that differ: \(equal.indices.filter { !equal[$0] })")
        }
    }

    @Test func agreesWithJSONDecoderOnEveryChangeShape() throws {
        let reader = VaultJSONReader()
        let change = VaultChange(changed: Self.records(), removed: ["gone", "gone \u{1F600} \"too\""])
        // The same change twice: the second time, every provider's settings are known already.
        for change in [change, change, VaultChange(changed: [], removed: [])] {
            let plaintext = try VaultJSONWriter.change(change)
            let read = try #require(plaintext.withUnsafeBytes { reader.change($0) })
            #expect(read == change)
        }
    }

    /// The records of every kind as the code before the provider registry stored them (keys
    /// sorted, `static` without `_0`).
    @Test func readsRecordsSavedBeforeTheRegistry() throws {
        let plaintext = Data(
            (#"{"sequence":3,"accounts":"# + ProviderRegistryTests.recordsSavedBeforeTheRegistry + "}").utf8)
        let expected = try JSONDecoder().decode(Body.self, from: plaintext)
        let read = try #require(plaintext.withUnsafeBytes { VaultJSONReader().snapshot($0) })
        #expect(read.generation == 3)
        // Kept as read where today's shape differs (`static` without `_0`); read as before.
        #expect(read.contents.accounts.map { $0.providerText != nil } == [false, false, false, false, true])
        #expect(
            read.contents.accounts.map {
                var record = $0; record.providerText = nil; return record
            } == expected.accounts)
        #expect(read.contents.accounts.map(\.provider.kind) == ["oauth2", "refresh_url", "sliding", "exec", "static"])
    }

    /// Keys in another order, whitespace and keys it does not know (values of every kind) read
    /// as `JSONDecoder` reads them; the members it does not know of an account, its `secrets`
    /// and its `token` are kept as their very text, in order (around the accounts and in other
    /// objects they are skipped).
    @Test func anyKeyOrderAndUnknownKeys() throws {
        let text = #"""
             { "future" : {"a":[1,2.5e3,{"b":null}],"c":"\u00e9"} ,
              "accounts" : [ { "needsLogin" : false , "secrets" : { "refreshToken" : "rt\/1" , "x" : [] } ,
                "provider" : { "static" : { "_0" : { } } } , "name" : "n" , "token" : null , "later":"\u00e9",
                "lastError" : { "at" : -1.5 , "message" : "m" , "code" : "c" , "extra" : true },
                "last" : 1e3 } ],
              "sequence" : 12 }
            """#
        let plaintext = Data(text.utf8)
        let expected = try JSONDecoder().decode(Body.self, from: plaintext)
        let read = try #require(plaintext.withUnsafeBytes { VaultJSONReader().snapshot($0) })
        #expect(read.generation == 12)
        var account = try #require(read.contents.accounts.first)
        #expect(account.unknown?.text.text == #""later":"\u00e9","last" : 1e3"#)
        #expect(account.secrets.unknown?.text.text == #""x" : []"#)
        account.unknown = nil
        account.secrets.unknown = nil
        #expect([account] == expected.accounts)
        // Compared outside #expect, whose failure message would print the refresh token.
        let refreshTokenRead = account.secrets.refreshToken?.text == "rt/1"
        #expect(refreshTokenRead, "the refresh token was not read")
    }

    /// What the reader keeps of a later release (members of the account, its `secrets` and its
    /// `token`; a `provider` object this release would write otherwise) the writer gives back as
    /// its very text, after every read and write; settings changed since are written anew.
    @Test func theWriterGivesBackWhatALaterReleaseWrote() throws {
        let provider = #"{"static":{"_0":{"later":{"a":1}}}}"#
        let members = [#""x" :[ 1 ]"#, #""y":"\u0041""#]
        let secrets = #""k":"v\/1""#
        let token = #""t":null"#
        let object =
            #"{"name":"n","provider":"# + provider + #","secrets":{"refreshToken":"rt","# + secrets + "},"
            + #""token":{"value":"v","type":"Bearer","expiresAt":1,"obtainedAt":0,"# + token + "},"
            + members.joined(separator: ",") + #","needsLogin":false}"#
        var text = #"{"sequence":1,"accounts":["# + object + "]}"
        for _ in 0..<3 {
            let read = try #require(Data(text.utf8).withUnsafeBytes { VaultJSONReader().snapshot($0) })
            #expect(read.contents.damaged.isEmpty && read.contents.accounts.count == 1)
            text = String(decoding: try VaultJSONWriter.snapshot(generation: 1, read.contents), as: UTF8.self)
            for kept in members + [secrets, token, #""provider":"# + provider] {
                #expect(text.contains(kept), "\(kept)")
            }
            #expect(text.contains(members.joined(separator: ",") + "}"), "the account's in their order, at its end")
        }
        var record = try #require(
            Data(text.utf8).withUnsafeBytes { VaultJSONReader().snapshot($0) }?.contents.accounts.first)
        record.provider = ProviderConfig(RefreshURLSettings(method: .get))
        record.token = nil
        let written = String(decoding: try VaultJSONWriter.account(record), as: UTF8.self)
        #expect(!written.contains("later") && !written.contains(token) && written.contains(secrets))
    }

    /// What the reader does not take: malformed JSON, and the wrong shape or a repeated key
    /// around the accounts.
    @Test(arguments: [
        #"{"accounts":[],"sequence":1"#,
        #"{"accounts":[]} x"#,
        #"{"accounts":[],"accounts":[]}"#,
        #"{"accounts":[{"name":"n","provider":{"static":{}},"secrets":{},"needsLogin":false,"x":[}]}"#,
        #"{"accounts":[],"sequence":18446744073709551616}"#,
        #"{"accounts":[],"sequence":-1}"#,
        #"{"accounts":[],"future":[[[[{"deep":}]]]]}"#,
        #"{"sequence":1}"#,
        #"[]"#,
        "",
    ])
    func givesNothingForWhatItDoesNotUnderstand(text: String) {
        let plaintext = Data(text.utf8)
        #expect(plaintext.withUnsafeBytes { VaultJSONReader().snapshot($0) } == nil)
    }

    /// An account object that is valid JSON but not a record this release reads (a value of
    /// another type, a member missing or repeated) is kept whole as damaged, with a reason that
    /// names the member, and the accounts around it are read.
    @Test(arguments: [
        #"{"name":"n","provider":{"static":{}},"secrets":{},"needsLogin":"no"}"#,
        #"{"name":"n","provider":{"static":{}},"needsLogin":false}"#,
        #"{"name":"n","provider":{"nope":{}},"secrets":{},"needsLogin":false}"#,
        #"{"name":"n","provider":"static","secrets":{},"needsLogin":false}"#,
        #"{"name":1,"provider":{"static":{}},"secrets":{},"needsLogin":false}"#,
        #"{"name":"n","provider":{"static":{}},"secrets":{"refreshToken":7},"needsLogin":false}"#,
        #"{"name":"n","provider":{"static":{}},"secrets":{},"needsLogin":false,"lastRefreshAt":"x"}"#,
        #"{"name":"n","provider":{"static":{}},"secrets":{},"needsLogin":false,"token":{"type":"B"}}"#,
        #"{"name":"n","name":"m","provider":{"static":{}},"secrets":{},"needsLogin":false}"#,
        #"{"name":"n","provider":{"static":{}},"secrets":{"dpopKey":"AAAA"},"needsLogin":false}"#,
        #"[1, {"x": "y"}]"#,
    ])
    func keepsAnAccountObjectItCannotReadWhole(object: String) throws {
        let good = #"{"name":"ok","provider":{"static":{}},"secrets":{},"needsLogin":false}"#
        let plaintext = Data(
            (#"{"accounts":["# + good + ",  " + object + " ," + good.replacing("ok", with: "ok2") + "]}").utf8)
        let read = try #require(plaintext.withUnsafeBytes { VaultJSONReader().snapshot($0) })
        #expect(read.contents.accounts.map(\.name) == ["ok", "ok2"])
        let damaged = try #require(read.contents.damaged.first)
        #expect(read.contents.damaged.count == 1)
        #expect(damaged.text.text == object, "kept as its very text")
        #expect(
            damaged.name
                == (object.contains(#""name":"n""#)
                    ? "n" : "unreadable-" + Sodium.hex(Sodium.sha256(Array(object.utf8)).prefix(8))))
        #expect(!damaged.reason.isEmpty && !damaged.reason.contains("AAAA"), "\(damaged.reason)")
    }

    @Test func givesNothingForAStringThatIsNotUTF8() {
        var bytes = Array(#"{"accounts":[{"name":"n"#.utf8)
        bytes += [0xC3, 0x28]
        bytes += Array(#"","provider":{"static":{}},"secrets":{},"needsLogin":false}]}"#.utf8)
        #expect(bytes.withUnsafeBytes { VaultJSONReader().snapshot($0) } == nil, "not valid JSON: the whole vault")
        #expect((try? JSONDecoder().decode(Body.self, from: Data(bytes))) == nil, "JSONDecoder refuses it too")
    }

    @Test func changeNeedsBothLists() {
        for text in [#"{"changed":[]}"#, #"{"removed":[]}"#, #"{"changed":[],"removed":[1]}"#] {
            #expect(Data(text.utf8).withUnsafeBytes { VaultJSONReader().change($0) } == nil, "\(text)")
        }
    }

    // MARK: Every field of the record

    /// The types whose fields the reader reads itself (provider settings go to `JSONDecoder`),
    /// with their field names as `Mirror` sees a sample, and where their JSON sits in a record.
    private static var readTypes: [(type: String, fields: [String], place: (String) -> String)] {
        let record = AccountRecord.sample("fields")
        let minimal = #""name":"n","provider":{"static":{"_0":{}}},"secrets":{},"needsLogin":false"#
        return [
            ("AccountRecord", fieldNames(record), { "{\(minimal),\($0)}" }),
            (
                "AccountSecrets", fieldNames(record.secrets),
                {
                    #"{"name":"n","provider":{"static":{"_0":{}}},"#
                        + #""needsLogin":false,"secrets":{"# + $0 + "}}"
                }
            ),
            (
                "AccessToken", fieldNames(record.token!),
                {
                    "{\(minimal),"
                        + #""token":{"value":"v","type":"Bearer","expiresAt":1,"obtainedAt":0,"# + $0 + "}}"
                }
            ),
            (
                "AccountError", fieldNames(record.lastError!),
                {
                    "{\(minimal),"
                        + #""lastError":{"code":"c","message":"m","at":0,"# + $0 + "}}"
                }
            ),
        ]
    }

    /// What the types keep of other releases (`UnknownMembers`, `ProviderText`): no key of theirs.
    private static let keptAsRead: Set<String> = ["unknown", "providerText"]

    /// The stored properties of `value`, which its `Codable` names its keys after (but those
    /// `keptAsRead`).
    private static func fieldNames(_ value: Any) -> [String] {
        Mirror(reflecting: value).children.compactMap(\.label).filter { !keptAsRead.contains($0) }
    }

    /// The fields of `value` (and of the read types it holds) that are `nil`, as `Type.field`.
    private static func missingFields(_ value: Any, type: String) -> [String] {
        Mirror(reflecting: value).children.filter { !keptAsRead.contains($0.label ?? "") }.flatMap {
            child -> [String] in
            let label = child.label ?? "?"
            let inner = Mirror(reflecting: child.value)
            guard inner.displayStyle == .optional else { return nested(child.value) }
            guard let wrapped = inner.children.first?.value else { return ["\(type).\(label)"] }
            return nested(wrapped)
        }
    }

    private static func nested(_ value: Any) -> [String] {
        switch value {
        case let secrets as AccountSecrets: missingFields(secrets, type: "AccountSecrets")
        case let token as AccessToken: missingFields(token, type: "AccessToken")
        case let error as AccountError: missingFields(error, type: "AccountError")
        case let mark as FleetMark: missingFields(mark, type: "FleetMark")
        default: []
        }
    }

    /// Whether the reader reads `key` in `place`: it finds the record damaged when a key it
    /// reads comes twice, and keeps one it does not know.
    private static func readerReads(key: String, place: (String) -> String) -> Bool {
        let text = #"{"accounts":["# + place(#""\#(key)":null,"\#(key)":null"#) + "]}"
        return Data(text.utf8).withUnsafeBytes { VaultJSONReader().snapshot($0) }?.contents.damaged.isEmpty == false
    }

    /// A record with every field set, written by `JSONEncoder`, read by the reader and written
    /// again, gives the same JSON: a field the reader does not read would be missing. The record
    /// has no field unset, so a field `AccountRecord` gains fails here until it is set below,
    /// and then until the reader reads it.
    @Test func aRecordWithEveryFieldSetSurvivesTheReader() throws {
        var record = AccountRecord.sample("every-field")
        record.secrets.refreshURL = SecretBytes("https://r.example/refresh/1")
        record.secrets.dpopKey = try DPoPKey.generate()
        record.token?.pushed = false
        record.loggedOut = false
        record.declared = true
        record.grantedScope = "read write"
        record.fleet = FleetMark(step: .unsharing, version: 3, id: "5e1d")
        let unset = Self.missingFields(record, type: "AccountRecord")
        #expect(unset.isEmpty, "set these fields in this test's record: \(unset)")

        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let written = try encoder.encode(Body(sequence: 1, accounts: [record]))
        let read = try #require(written.withUnsafeBytes { VaultJSONReader().snapshot($0) })
        let again = try encoder.encode(Body(sequence: read.generation, accounts: read.contents.accounts))
        // Compared key by key and outside #expect, whose message would print the secrets.
        let before = try #require(JSONValue.object(decoding: written)?["accounts"])
        let after = try #require(JSONValue.object(decoding: again)?["accounts"])
        let differing = Self.differingPaths(before, after, at: "accounts")
        #expect(differing.isEmpty, "the reader lost or changed: \(differing)")
    }

    /// Where two JSON values differ, as paths of keys (no values: they may be secrets).
    private static func differingPaths(_ one: JSONValue, _ other: JSONValue, at path: String) -> [String] {
        switch (one, other) {
        case (.object(let left), .object(let right)):
            return Set(left.keys).union(right.keys).sorted().flatMap { key in
                differingPaths(left[key] ?? .null, right[key] ?? .null, at: "\(path).\(key)")
            }
        case (.array(let left), .array(let right)) where left.count == right.count:
            return zip(left, right).enumerated().flatMap { differingPaths($1.0, $1.1, at: "\(path)[\($0)]") }
        default:
            return one == other ? [] : [path]
        }
    }

    /// Every stored property of the record and of the types the reader reads within it is a
    /// key the reader reads: one it skipped would be dropped from the vault at the next save.
    @Test func readsEveryFieldOfTheRecordsTypes() {
        for (type, fields, place) in Self.readTypes {
            #expect(!fields.isEmpty)
            let base = #"{"accounts":["# + place(#""unread":1"#) + "]}"
            let read = Data(base.utf8).withUnsafeBytes { VaultJSONReader().snapshot($0) }
            #expect(read?.contents.damaged.isEmpty == true && read?.contents.accounts.count == 1, "\(type)")
            // The probe tells a read key from a skipped one.
            #expect(!Self.readerReads(key: "notAField", place: place), "\(type)")
            let unread = fields.filter { !Self.readerReads(key: $0, place: place) }
            #expect(unread.isEmpty, "\(type) fields the vault reader skips: \(unread)")
        }
    }
}
