@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// A record the release cannot read is one account's problem (protocol/VAULT.md, "Records of
/// other releases"): it is shown `damaged` with its reason, refused with an error naming it,
/// kept byte for byte through every rewrite, deleted by `remove`; the others are served.
@Suite struct DamagedRecordTests {
    /// A DPoP key that does not decode (base64url of "not-a-key", not a P-256 scalar).
    static let badKey = #""dpopKey":"bm90LWEta2V5""#

    /// Account `index` of the test's vault: a `static` account holding a token for a day.
    static func record(_ index: Int, now: Date) throws -> AccountRecord {
        AccountRecord(
            name: "acct-\(index)", provider: ProviderConfig(StaticSettings()), secrets: AccountSecrets(),
            token: AccessToken(
                value: try SecretBytes("at-\(index)"), type: "Bearer", expiresAt: now.addingTimeInterval(86_400),
                obtainedAt: now),
            needsLogin: false, lastError: nil, lastRefreshAt: nil)
    }

    /// Writes the snapshot of generation 1 holding the account objects `objects` at `path`.
    static func writeVault(_ objects: [String], at path: String, key: SecretKey) {
        let plaintext = Array((#"{"sequence":1,"accounts":["# + objects.joined(separator: ",") + "]}").utf8)
        let sealed = VaultSnapshot.seal(plaintext: plaintext, key: key).file
        #expect(FileManager.default.createFile(atPath: path, contents: sealed, attributes: [.posixPermissions: 0o600]))
    }

    @Test func oneRecordThatDoesNotDecodeAmongAHundredIsThatAccountsProblem() async throws {
        try await BrokerHarness.run { harness in
            let now = harness.clock.now()
            let records = try (0..<100).map { try Self.record($0, now: now) }
            var objects = try records.map { String(decoding: try JSONEncoder().encode($0), as: UTF8.self) }
            objects[42] = objects[42].replacing(#""secrets":{}"#, with: #""secrets":{"# + Self.badKey + "}")
            #expect(objects[42].contains(Self.badKey))
            let key = try VaultKey.load(path: harness.keyPath, create: false)
            let path = harness.directory.file("hundred/vault")
            let vault = try Vault(path: path, key: key)
            Self.writeVault(objects, at: path, key: key)
            let broker = try Broker(
                vault: vault, settings: harness.settings, http: harness.http, clock: harness.clock,
                logger: harness.logs.logger())

            for index in 0..<100 where index != 42 {
                let served = try await broker.token(account: "acct-\(index)", minTTL: 60).result.accessToken
                #expect(served == "at-\(index)")
            }
            let status = try await broker.status(account: nil)
            #expect(status.count == 100)
            let damaged = try #require(status.first { $0.account == "acct-42" })
            #expect(damaged.state == "damaged")
            #expect(damaged.lastError?.message.contains("DPoP key") == true, "\(String(describing: damaged.lastError))")
            #expect(damaged.adviceCommand == "brokerctl remove acct-42")
            #expect(status.filter { $0.state == "damaged" }.count == 1)
            #expect(try await broker.status(account: "acct-42").first?.state == "damaged")
            let refused = await #expect(throws: BrokerError.self) {
                _ = try await broker.token(account: "acct-42", minTTL: 60)
            }
            #expect(refused?.code == .damaged)
            #expect(
                refused?.message.contains("acct-42") == true && refused?.message.contains("brokerctl remove") == true)
            // Nothing of the record's secrets in any answer or log line.
            let shown = "\(status) \(String(describing: refused))" + harness.logs.all.joined()
            #expect(!shown.contains("bm90LWEta2V5") && !shown.contains("at-42"))
            // No account of its name is created over it.
            let added = await #expect(throws: BrokerError.self) {
                _ = try await broker.add(
                    account: "acct-42", provider: ProviderSpec(kind: "static"),
                    tokens: TokenSet(accessToken: "new", expiresIn: 3600))
            }
            #expect(added?.code == .damaged)

            // Kept as it was, byte for byte, until removed.
            let kept = try Self.reload(path, key: key, in: harness)
            #expect(kept.damaged.map(\.name) == ["acct-42"])
            #expect(kept.damaged.first?.text.text == objects[42])

            _ = try await broker.remove(account: "acct-42")
            #expect(try await broker.status(account: nil).count == 99)
            let left = try Self.reload(path, key: key, in: harness)
            #expect(left.damaged.isEmpty)
            let others = records.enumerated().filter { $0.offset != 42 }.map(\.element).sorted { $0.name < $1.name }
            // Compared outside #expect, whose message would print the records.
            let unchanged = left.accounts == others
            #expect(unchanged, "the other 99 records changed")
            await broker.drain()
        }
    }

    /// A damaged record stays as its very text through a log record and a compaction (a save
    /// that writes a whole snapshot), beside the accounts that change.
    @Test func aDamagedRecordIsKeptThroughTheLogAndACompaction() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let key = try VaultKey.load(path: directory.file("vault.key"), create: true)
        let path = directory.file("state/vault")
        let now = Date(timeIntervalSince1970: 1_795_422_600)
        var record = try Self.record(1, now: now)
        let damaged =
            #"{"name":"acct-2","provider":{"static":{}},"secrets":{ "# + Self.badKey + #" },"needsLogin":false}"#
        do {
            let vault = try Vault(path: path, key: key)
            Self.writeVault(
                [String(decoding: try JSONEncoder().encode(record), as: UTF8.self), damaged], at: path, key: key)
            #expect(try vault.load()?.damaged.first?.text.text == damaged)
            let snapshot = try Data(contentsOf: URL(fileURLWithPath: path))
            for round in 0..<3 {
                // A token of 40 KB: the log passes 32 KiB at once, so the next save compacts.
                record.token?.value = try SecretBytes(String(repeating: "\(round)", count: 40_000))
                try vault.save(changed: [record], removed: [])
            }
            #expect(try Data(contentsOf: URL(fileURLWithPath: path)) != snapshot, "a snapshot was written")
        }
        let reread = try Vault(path: path, key: key).load()
        #expect(reread?.damaged.map(\.name) == ["acct-2"])
        #expect(reread?.damaged.first?.text.text == damaged)
        #expect(reread?.damaged.first?.reason.contains("DPoP key") == true)
        let kept = reread?.accounts == [record]
        #expect(kept, "the changed account")
    }

    /// DPoP keys past what OpenSSL's secure heap holds (its 1 MiB, 64 bytes a key) are their
    /// accounts' problem: a real brokerd (its own process, so that this process's heap, which
    /// the other tests share, stays as it is) loads a vault of 20,000 accounts with keys, shows
    /// those it found no room for `damaged` with that reason, and serves the others.
    @Test func keysTheSecureHeapCannotHoldAreTheirAccountsProblem() async throws {
        let broker = try BrokerProcess()
        let key = try VaultKey.load(path: broker.keyPath, create: true)
        try FileManager.default.createDirectory(
            at: broker.stateDirectory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let template = String(decoding: try JSONEncoder().encode(try Self.record(0, now: Date())), as: UTF8.self)
        let count = 20_000
        // Scalars below the P-256 group's order: their first byte under 0xff.
        let keys = (0..<count).map { _ in
            DPoPVerifier.base64URL(
                Data([UInt8.random(in: 1..<0xff)] + (1..<32).map { _ in UInt8.random(in: 0...0xff) }))
        }
        // The template with its name and its empty secrets cut out, to be put back per account.
        let cuts = try [#""name":"acct-0""#, #""secrets":{}"#].map { try #require(template.range(of: $0)) }
        let (first, second) = (cuts.min { $0.lowerBound < $1.lowerBound }!, cuts.max { $0.lowerBound < $1.lowerBound }!)
        let pieces = [
            template[..<first.lowerBound], template[first.upperBound..<second.lowerBound],
            template[second.upperBound...],
        ]
        let nameFirst = first == cuts[0]
        let objects = keys.enumerated().map { index, key in
            let fields = [#""name":"acct-\#(index)""#, #""secrets":{"dpopKey":"\#(key)"}"#]
            let (one, two) = nameFirst ? (fields[0], fields[1]) : (fields[1], fields[0])
            return String(pieces[0]) + one + pieces[1] + two + pieces[2]
        }
        #expect(objects[1].contains(#""name":"acct-1""#) && objects[1].contains("dpopKey"))
        Self.writeVault(objects, at: broker.vaultPath, key: key)
        try await broker.start(timeout: 300)  // 20,000 keys made in a debug build
        defer { broker.stop() }

        let shown = try await broker.brokerctl(["status", "--json"]).stdout
        let object = try JSONSerialization.jsonObject(with: Data(shown.utf8)) as? [String: Any]
        let accounts = try #require(
            object?["accounts"] as? [[String: Any]],
            "status --json: \(shown.prefix(300))")
        #expect(accounts.count == count)
        let damaged = accounts.filter { $0["state"] as? String == "damaged" }
        let served = accounts.filter { $0["state"] as? String == "valid" }
        #expect(
            !damaged.isEmpty && damaged.count + served.count == count, "\(damaged.count) damaged, \(served.count) valid"
        )
        #expect(served.count >= 16_000, "the documented room: about 16,000 keys")
        let reasons = Set(damaged.map { ($0["last_error"] as? [String: Any])?["message"] as? String ?? "" })
        #expect(reasons == ["OpenSSL's secure heap had no room for its DPoP key"], "\(reasons)")

        let good = try #require(served.first?["account"] as? String)
        let token = try await broker.brokerctl(["token", good])
        #expect(token.status == 0 && token.stdout.contains("at-0"))
        let bad = try #require(damaged.first?["account"] as? String)
        let refused = try await broker.brokerctl(["token", bad])
        #expect(refused.status != 0 && refused.stderr.contains("brokerctl remove \(bad)"), "\(refused.stderr)")
        let removed = try await broker.brokerctl(["remove", bad])
        #expect(removed.status == 0, "\(removed.stderr)")
        #expect(broker.stop() == 0)
        // Every word of the log that could be a key (43 characters of base64url), against the keys.
        let words = broker.log.split { !($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }
        #expect(Set(words.filter { $0.count == 43 }.map(String.init)).isDisjoint(with: keys), "no key in the log")
    }

    /// What a broker started on a copy of the vault at `path` would load.
    static func reload(_ path: String, key: SecretKey, in harness: BrokerHarness) throws -> VaultContents {
        let copy = harness.directory.file("copy-\(UUID().uuidString)/vault")
        let vault = try Vault(path: copy, key: key)
        try copyVault(from: path, to: copy)
        return try #require(try vault.load())
    }
}
