@testable import BrokerEngine
import BrokerFleet
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Logging
import NIOCore
import PostgresNIO
import Testing
import TestSupport

/// The shared store against a real PostgreSQL server per test (`PostgresServer`): the schema
/// and its canary, rows sealed to their name and version, tampering refused row by row, one
/// lease holder at a time, and compare-and-swap commits.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct PostgresFleetStoreTests {
    static let logger = Logger(label: "fleet-test")

    /// A record with a refresh token, a client secret and an access token, each unique.
    static func record(_ name: String) -> AccountRecord {
        let now = Date(timeIntervalSince1970: 1_795_000_000)
        return AccountRecord(
            name: name,
            provider: ProviderConfig(
                OAuth2Settings(
                    tokenEndpoint: URL(string: "https://idp.example/oauth/token/\(name)")!, clientID: "client-\(name)",
                    clientAuth: .clientSecretBasic, scope: "read")),
            secrets: AccountSecrets(
                refreshToken: try! SecretBytes("rt-\(UUID().uuidString)"), refreshExpiresAt: nil,
                clientSecret: try! SecretBytes("cs-\(UUID().uuidString)")),
            token: AccessToken(
                value: try! SecretBytes("at-\(UUID().uuidString)"), type: "Bearer", expiresAt: now + 3600,
                obtainedAt: now, idToken: nil, scope: "read"),
            needsLogin: false, lastError: nil, lastRefreshAt: now)
    }

    static func key() -> SecretKey { SecretKey(bytes: Sodium.randomBytes(Sodium.keyLength))! }

    /// Runs `body` with a fresh server and a client on it; stops both on every path.
    static func withDatabase(_ body: (PostgresServer, PostgresClient) async throws -> Void) async throws {
        let server = try await PostgresServer.start()
        defer { server.stop() }
        let client = PostgresClient(
            configuration: .init(
                host: "127.0.0.1", port: server.port, username: server.username, password: server.password,
                database: server.database, tls: .disable))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            try await body(server, client)
        }
    }

    /// Runs `body` with a fresh database whose schema a broker of host `a` made, that broker
    /// (in process) joined with a lease of 90 s, and a maker of stores of that database for any
    /// host, each with a lease holder of its own, as a process has.
    static func withFleet(
        _ body: (PostgresServer, BrokerHarness, _ store: @escaping (String) -> PostgresFleetStore) async throws -> Void
    ) async throws {
        try await withDatabase { server, client in
            let key = key()
            let store = { (host: String) in PostgresFleetStore(client: client, key: key, host: host, logger: logger) }
            try await store("a").prepare()
            let harness = try await BrokerHarness.start()
            defer { Task { await harness.stop() } }
            await harness.broker.joinFleet(store("a"), leaseSeconds: 90)
            try await body(server, harness, store)
        }
    }

    /// Adds the shared account "api" on `harness` (access token "at-pushed", refresh token "rt-0").
    static func addSharedAccount(to harness: BrokerHarness) async throws {
        _ = try await harness.broker.add(
            account: "api", provider: harness.provider,
            tokens: TokenSet(accessToken: "at-pushed", expiresIn: 3600, refreshToken: "rt-0"), shared: true)
    }

    /// `withFleet` with the shared account "api" (access token "at-pushed", refresh token
    /// "rt-0") added on a, and a second broker b serving it from its row.
    static func withSharedAccount(
        _ body: (_ a: BrokerHarness, _ b: BrokerHarness, _ store: @escaping (String) -> PostgresFleetStore) async throws
            -> Void
    ) async throws {
        try await withFleet { _, a, store in
            try await PostgresFleetStoreTests.addSharedAccount(to: a)
            let b = try await BrokerHarness.start()
            defer { Task { await b.stop() } }
            await b.broker.joinFleet(store("b"), leaseSeconds: 90)
            try await body(a, b, store)
        }
    }

    static func text(_ secret: SecretBytes?) -> String { secret?.text ?? "" }

    @Test func aSealedRecordOpensOnlyAsItsNameShareAndVersionUnderItsKey() throws {
        let key = Self.key()
        let record = Self.record("api")
        let share = SharedRecord.newShareID()
        #expect(SharedRecord.isShareID(share) && share != SharedRecord.newShareID())
        let sealed = try SharedRecord.seal(record, share: share, version: 7, key: key)
        let opened = try SharedRecord.open(sealed, name: "api", share: share, version: 7, key: key)
        #expect(
            opened.name == "api" && Self.text(opened.secrets.refreshToken) == Self.text(record.secrets.refreshToken))
        for (name, otherShare, version, otherKey) in [
            ("git", share, 7, key), ("api", share, 6, key), ("api", SharedRecord.newShareID(), 7, key),
            ("api", share, 7, Self.key()),
        ] as [(String, String, Int64, SecretKey)] {
            #expect(throws: FleetError.self) {
                try SharedRecord.open(sealed, name: name, share: otherShare, version: version, key: otherKey)
            }
        }
        var flipped = sealed
        flipped[flipped.count / 2] ^= 1
        #expect(throws: FleetError.self) {
            try SharedRecord.open(flipped, name: "api", share: share, version: 7, key: key)
        }
    }

    /// A broker waiting for another host's lease reads the row every 0.2 s, or just after the
    /// lease it read runs out, if that is sooner.
    @Test func aWaitForALeaseReadsTheRowAsTheLeaseRunsOut() {
        func pause(_ left: Double?) -> Duration {
            Broker.pollPause(
                after: SharedRow(
                    record: Self.record("api"), share: SharedRecord.newShareID(), version: 1, leaseHolder: nil,
                    lastRefreshedBy: nil, leaseRemaining: left))
        }
        #expect(Broker.pollPause(after: nil) == .milliseconds(200))
        #expect(pause(nil) == .milliseconds(200) && pause(5) == .milliseconds(200) && pause(.nan) == .milliseconds(200))
        #expect(pause(0.05) == .milliseconds(70))
        #expect(pause(-1) == .milliseconds(20))
    }

    @Test func theSchemaIsMadeOnceAndAnotherFleetsKeyWritesNothing() async throws {
        try await Self.withDatabase { server, client in
            let key = Self.key()
            let first = PostgresFleetStore(client: client, key: key, host: "a", logger: Self.logger)
            #expect(try await first.prepare() == 2)
            #expect(try await first.insert(Self.record("api"), share: SharedRecord.newShareID()))
            let second = PostgresFleetStore(client: client, key: key, host: "b", logger: Self.logger)
            #expect(try await second.prepare() == 2, "an existing schema is checked, not made again")
            #expect(try await second.read("api")?.version == 1)

            let before = try await server.dump()
            let stranger = PostgresFleetStore(client: client, key: Self.key(), host: "c", logger: Self.logger)
            let error = await #expect(throws: FleetError.self) { try await stranger.prepare() }
            #expect(error?.description.contains("another fleet") == true)
            #expect(try await server.dump() == before, "nothing written")
        }
    }

    @Test func aRowRoundTripsAndTheDatabaseHoldsNoSecretInClear() async throws {
        try await Self.withDatabase { server, client in
            let store = PostgresFleetStore(client: client, key: Self.key(), host: "a", logger: Self.logger)
            try await store.prepare()
            let record = Self.record("api")
            #expect(try await store.insert(record, share: SharedRecord.newShareID()))
            #expect(try await store.insert(record, share: SharedRecord.newShareID()) == false, "the name is taken")
            let row = try #require(try await store.read("api"))
            #expect(row.version == 1 && row.lastRefreshedBy == "a" && row.leaseHolder == nil)
            #expect(Self.text(row.record.secrets.refreshToken) == Self.text(record.secrets.refreshToken))
            #expect(Self.text(row.record.token?.value) == Self.text(record.token?.value))

            let dump = try await server.dump()
            #expect(dump.contains("api"), "the name is in clear")
            let secrets = [
                Self.text(record.secrets.refreshToken), Self.text(record.secrets.clientSecret),
                Self.text(record.token?.value), "https://idp.example/oauth/token/api",
            ]
            // Checked outside #expect, whose failure message would print the secret.
            let leaked = secrets.filter { dump.contains($0) }.count
            #expect(leaked == 0, "\(leaked) secret(s) in clear in the dump")
        }
    }

    @Test func aFlippedCopiedOrRolledBackRowIsRefusedByNameAndTheOthersAreServed() async throws {
        try await Self.withDatabase { _, client in
            let store = PostgresFleetStore(client: client, key: Self.key(), host: "a", logger: Self.logger)
            try await store.prepare()
            let apiShare = SharedRecord.newShareID()
            for name in ["api", "git", "web"] {
                #expect(
                    try await store.insert(
                        Self.record(name), share: name == "api" ? apiShare : SharedRecord.newShareID()))
            }
            let old = try await client.query("SELECT sealed FROM tokenbroker_accounts WHERE name = 'api'")
                .decode(ByteBuffer.self).first { _ in true }
            #expect(try await store.commit(Self.record("api"), share: apiShare, over: 1))

            // git's sealed bytes flipped; web's replaced by api's (with api's version).
            try await client.query(
                "UPDATE tokenbroker_accounts SET sealed = overlay(sealed placing '\\x00'::bytea from 40 for 1) WHERE name = 'git'"
            )
            try await client.query(
                """
                UPDATE tokenbroker_accounts SET (sealed, version) = (SELECT sealed, version FROM tokenbroker_accounts
                WHERE name = 'api') WHERE name = 'web'
                """)
            var refused: [String: String] = [:]
            var served: [String] = []
            for reading in try await store.readAll() {
                switch reading {
                case .row(let row): served.append(row.record.name)
                case .refused(let name, let reason): refused[name] = reason
                }
            }
            #expect(served == ["api"])
            #expect(refused.keys.sorted() == ["git", "web"])
            #expect(refused["web"]?.contains("does not open as this account") == true)

            // api put back at version 1, sealed bytes and all: a store that saw version 2 refuses it.
            let oldSealed = try #require(old)
            try await client.query(
                "UPDATE tokenbroker_accounts SET version = 1, sealed = \(oldSealed) WHERE name = 'api'")
            let error = await #expect(throws: FleetError.self) { try await store.read("api") }
            #expect(error?.description.contains("rolled back") == true)
            #expect(error?.description.contains("api") == true)
        }
    }

    /// A removed row leaves its share ended: a late insert of that share is refused, a new share
    /// of the name starts at version 1, and the removed row put back (at its last version) is
    /// refused by a store that saw it go, as is its share's older row.
    @Test func aRemovedShareIsNeitherInsertedAgainNorBroughtBack() async throws {
        try await Self.withDatabase { _, client in
            let key = Self.key()
            let store = PostgresFleetStore(client: client, key: key, host: "a", logger: Self.logger)
            try await store.prepare()
            let (first, second) = (SharedRecord.newShareID(), SharedRecord.newShareID())
            #expect(try await store.insert(Self.record("api"), share: first))
            #expect(try await store.commit(Self.record("api"), share: first, over: 1))
            let last = try await client.query("SELECT sealed FROM tokenbroker_accounts WHERE name = 'api'")
                .decode(ByteBuffer.self).first { _ in true }
            #expect(try await store.shareEnded(first) == false)
            #expect(try await store.delete("api", at: nil))
            #expect(try await store.shareEnded(first))
            #expect(try await store.insert(Self.record("api"), share: first) == false, "a late insert of that share")
            #expect(try await store.read("api") == nil)

            #expect(try await store.insert(Self.record("api"), share: second))
            #expect(try await store.read("api")?.share == second)
            #expect(try await store.commit(Self.record("api"), share: second, over: 1))
            let lastSealed = try #require(last)
            try await client.query(
                "UPDATE tokenbroker_accounts SET share_id = \(first), version = 2, sealed = \(lastSealed) WHERE name = 'api'"
            )
            let error = await #expect(throws: FleetError.self) { try await store.read("api") }
            #expect(error?.description.contains("a share that was removed") == true)
            // The new share's commit compares its share too: it does not land on the old one.
            #expect(try await store.commit(Self.record("api"), share: second, over: 2) == false)
            // A restarted broker's store, which never saw the share end, refuses it too: the
            // database notes the share as removed.
            let fresh = PostgresFleetStore(client: client, key: key, host: "c", logger: Self.logger)
            let again = await #expect(throws: FleetError.self) { try await fresh.read("api") }
            #expect(again?.description.contains("a share that was removed") == true)
        }
    }

    @Test func oneHostHoldsALeaseAndALapsedHolderCannotOverwriteANewerVersion() async throws {
        try await Self.withDatabase { _, client in
            let key = Self.key()
            let a = PostgresFleetStore(client: client, key: key, host: "a", logger: Self.logger)
            let b = PostgresFleetStore(client: client, key: key, host: "b", logger: Self.logger)
            try await a.prepare()
            let share = SharedRecord.newShareID()
            #expect(try await a.insert(Self.record("api"), share: share))
            try await client.withConnection { connection in
                try await connection.listen(on: PostgresFleetStore.channel) { notifications in
                    let leaseA = try #require(try await a.takeLease("api", seconds: 1))
                    #expect(leaseA.row.version == 1 && leaseA.remaining <= .seconds(1) && !leaseA.replacedLapsed)
                    #expect(try await b.takeLease("api", seconds: 1) == nil, "a holds it")
                    let held = try #require(try await b.read("api"))
                    #expect(held.leaseHolder == "a" && (held.leaseRemaining ?? 0) > 0 && held.leaseRemaining! <= 1)

                    // Another broker given the same host name is another holder all the same.
                    let twin = PostgresFleetStore(client: client, key: key, host: "a", logger: Self.logger)
                    #expect(try await twin.takeLease("api", seconds: 1) == nil, "a's lease is not its twin's")

                    // a stalls past its lease (1 s, by the PostgreSQL server's clock); b takes the
                    // lapsed lease and commits first.
                    try await Task.sleep(for: .milliseconds(1300))
                    #expect(try await b.read("api")?.leaseLapsed == true)
                    let leaseB = try #require(try await b.takeLease("api", seconds: 30))
                    #expect(leaseB.row.version == 1 && leaseB.replacedLapsed, "b took over a lapsed lease")
                    #expect(try await b.commit(Self.record("api"), share: share, over: 1))
                    #expect(
                        try await a.commit(Self.record("api"), share: share, over: 1) == false,
                        "a's compare-and-swap fails")
                    let row = try #require(try await a.read("api"))
                    #expect(row.version == 2 && row.lastRefreshedBy == "b" && row.leaseHolder == nil)

                    // Every lease and the commit were announced, each as what it is to the other
                    // broker and as nothing to its own.
                    var iterator = notifications.makeAsyncIterator()
                    var told: [(a: FleetNotice?, b: FleetNotice?)] = []
                    for _ in 0..<3 {
                        let payload = try #require(try await iterator.next()).payload
                        told.append((a.notice(payload), b.notice(payload)))
                    }
                    #expect(told[0].a == nil && told[0].b == .leased("api"), "a's lease")
                    #expect(told[1].a == .leased("api") && told[1].b == nil, "b's lease")
                    #expect(told[2].a == .committed("api") && told[2].b == nil, "b's commit")
                }
            }
        }
    }
}
