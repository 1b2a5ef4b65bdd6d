@testable import BrokerEngine
import BrokerFleet
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import PostgresNIO
import Testing
import TestSupport

/// A later release's fields in an account's record (protocol/VAULT.md, "Records of other
/// releases"; docs/fleet.md, "Rows"): kept byte for byte through rotations, a compaction, a
/// share (the row), an unshare (back to the vault) and a restart, against a real PostgreSQL.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetRecordsOfOtherReleasesTests {
    /// A member of the account object this release does not know, with the spacing a writer of
    /// another release might use: kept as these very bytes.
    static let futureField = #""futureField" : {"x": [1,2]}"#
    /// One in its `secrets`, with an escape this release would write otherwise.
    static let futureSecret = #""futureKey":"k\u002d1""#

    @Test func aFieldThisReleaseDoesNotKnowOutlivesRotationsACompactionSharingAndARestart() async throws {
        try await PostgresFleetStoreTests.withFleet { _, harness, store in
            // The account as this release writes it (then gone from the harness's broker), given
            // the two members by hand in a vault of its own.
            try await harness.addWithValidToken()
            let written = try #require(try harness.vaultCopy()?.accounts.first)
            _ = try await harness.broker.remove(account: "api")
            var record = String(decoding: try JSONEncoder().encode(written), as: UTF8.self)
            record.removeLast()
            record = record.replacing(#""secrets":{"#, with: #""secrets":{"# + Self.futureSecret + ",")
            record += "," + Self.futureField + "}"
            let key = try VaultKey.load(path: harness.keyPath, create: false)
            let path = harness.directory.file("future/vault")
            let vault = try Vault(path: path, key: key)
            let plaintext = Array((#"{"sequence":1,"accounts":["# + record + "]}").utf8)
            let sealed = VaultSnapshot.seal(plaintext: plaintext, key: key).file
            #expect(
                FileManager.default.createFile(atPath: path, contents: sealed, attributes: [.posixPermissions: 0o600]))

            let broker = try Broker(
                vault: vault, settings: harness.settings, http: harness.http, clock: harness.clock,
                logger: harness.logs.logger())
            defer { Task { await broker.drain() } }
            await broker.joinFleet(store("c"), leaseSeconds: 90)
            let name = try AccountName("api")

            // Ten rotations at least, and on until a save writes a new snapshot.
            let first = try Self.inode(path)
            var rotations = 0
            while try rotations < 10 || Self.inode(path) == first {
                _ = try await broker.refreshNow(name)
                rotations += 1
                try #require(rotations < 1_000, "no compaction")
            }
            #expect(harness.idp.refreshCalls.count == rotations)
            var snapshot = try VaultSnapshot.plaintext(
                Array(try Data(contentsOf: URL(fileURLWithPath: path))), path: path, key: key
            ).plaintext
            defer { Sodium.wipe(&snapshot) }
            #expect(
                Self.holds(snapshot, Self.futureField) && Self.holds(snapshot, Self.futureSecret),
                "the compaction kept them")

            _ = try await broker.share(name)
            let row = try #require(try await store("check").read("api"))
            #expect(Self.members(of: row.record) == [Self.futureField, Self.futureSecret], "the row keeps them")
            _ = try await broker.unshare(name)
            #expect(try await store("check").read("api") == nil)

            // A restart on the vault as it is now, then the vault decrypted.
            let copy = harness.directory.file("restarted/vault")
            let restartedVault = try Vault(path: copy, key: key)
            try copyVault(from: path, to: copy)
            let restarted = try Broker(
                vault: restartedVault, settings: harness.settings, http: harness.http, clock: harness.clock,
                logger: harness.logs.logger())
            _ = try await restarted.refreshNow(name)
            await restarted.drain()
            let reread = try Vault(path: harness.directory.file("reread/vault"), key: key)
            try copyVault(from: copy, to: reread.path)
            let stored = try #require(try reread.load()?.accounts.first { $0.name == "api" })
            #expect(Self.members(of: stored) == [Self.futureField, Self.futureSecret], "the vault keeps them")
            #expect(!harness.logs.all.contains { $0.contains("k\\u002d1") || $0.contains("futureKey") })
        }
    }

    /// Schema 2 marks a fleet whose brokers keep what they do not know: a database a release
    /// before it made (schema 1) is brought to 2, which that release then refuses at start as
    /// this one refuses a later schema, having written nothing.
    @Test func theSchemaMarksTheRuleSoAnOlderReleaseRefusesTheFleet() async throws {
        try await PostgresFleetStoreTests.withDatabase { server, client in
            let key = PostgresFleetStoreTests.key()
            let store = { (host: String) in
                PostgresFleetStore(client: client, key: key, host: host, logger: PostgresFleetStoreTests.logger)
            }
            #expect(try await store("a").prepare() == 2)
            try await client.query("UPDATE tokenbroker_schema SET version = 1", logger: PostgresFleetStoreTests.logger)
            #expect(try await store("b").prepare() == 2, "schema 1 is brought to 2")
            try await client.query("UPDATE tokenbroker_schema SET version = 3", logger: PostgresFleetStoreTests.logger)
            let before = try await server.dump()
            let refused = await #expect(throws: FleetError.self) { try await store("c").prepare() }
            #expect(refused?.description.contains("newer than this brokerd's (2): upgrade brokerd") == true)
            #expect(try await server.dump() == before, "nothing written")
        }
    }

    /// The unknown members of `record` and of its `secrets`, as text.
    static func members(of record: AccountRecord) -> [String?] {
        [record.unknown?.text.text, record.secrets.unknown?.text.text]
    }

    static func holds(_ plaintext: [UInt8], _ text: String) -> Bool {
        let needle = Array(text.utf8)
        return plaintext.indices.contains { plaintext[$0...].starts(with: needle) }
    }

    /// The inode of `path`: a new one once a snapshot was renamed over it.
    static func inode(_ path: String) throws -> UInt64 {
        var status = stat()
        guard stat(path, &status) == 0 else { throw HarnessError("cannot stat \(path)") }
        return UInt64(status.st_ino)
    }
}
