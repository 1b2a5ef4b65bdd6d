import BrokerCore
import Logging
import NIOCore
import PostgresNIO
import Synchronization

/// The fleet's shared store in PostgreSQL (docs/fleet.md). Each shared account is a row: its
/// name, a version, its record sealed with the fleet key (`SharedRecord`: the name and version
/// bound in), the lease holder and the lease's end, set by the database's clock. One broker at
/// a time holds an account's lease and refreshes it; every commit compares and swaps the
/// version, so a holder whose lease lapsed overwrites nothing newer. Every row read is checked:
/// one that does not open, or is older than a version this broker saw, is refused by name and
/// the others are served.
public final class PostgresFleetStore: SharedAccountStore {
    /// The channel every lease taken or released and every commit notifies; the payload is
    /// `lease`, `release` or `commit`, the lease holder or host, and the account's name,
    /// separated by spaces (names and holders have none).
    public static let channel = "tokenbroker_accounts"

    /// The client every call goes through; `FleetConnection.reconnect` puts a fresh one in.
    private let client: Mutex<PostgresClient>
    private let key: SecretKey
    /// This broker's name in rows (`[fleet] host`).
    public let host: String
    /// Who holds a lease this broker takes: its host name and a random suffix of this process,
    /// so that two brokers given the same `host` never share a lease.
    private let holder: String
    private let logger: Logger
    /// How long a call waits for the database: postgres-nio queues a query while no connection
    /// can be made (the database down or cut off) and `statement_timeout` acts only on the
    /// server, so without this a refresh would wait for the database's return.
    private let deadline: Duration
    /// The highest version seen of each account, so that a row put back at an older version is
    /// refused.
    private let seen = Mutex<[String: Int64]>([:])

    /// A store on `client` (which its owner runs) for `host`, sealing with `key`.
    public init(client: PostgresClient, key: SecretKey, host: String, logger: Logger, deadline: Duration = .seconds(10))
    {
        self.client = Mutex(client)
        self.deadline = deadline
        self.key = key
        self.host = host
        self.holder = host + "/" + String(UInt64.random(in: 0...UInt64.max), radix: 16)
        self.logger = logger
    }

    /// Makes or checks the schema (`FleetSchema.prepare`): throws, having written nothing, when
    /// the fleet key is another fleet's. Returns the schema version.
    @discardableResult
    public func prepare() async throws -> Int32 {
        try await FleetSchema.prepare(currentClient, key: key, logger: logger)
    }

    /// Records that this host was seen now (`brokerctl fleet status` lists the hosts).
    public func noteHost() async throws {
        _ = try await query(
            """
            INSERT INTO tokenbroker_hosts (host, last_seen) VALUES (\(host), now())
            ON CONFLICT (host) DO UPDATE SET last_seen = now()
            """)
    }

    /// The columns every read of rows takes; a lease is shown only while it runs.
    static let selection =
        "SELECT name, version, sealed, CASE WHEN lease_until > now() THEN lease_holder END, last_refreshed_by, "
        + "lease_holder IS NOT NULL AND lease_until <= now() FROM tokenbroker_accounts"

    /// Every shared account, each row checked on its own.
    public func readAll() async throws -> [SharedReading] {
        let readings = try await readings("\(unescaped: Self.selection) ORDER BY name")
        let names = Set(
            readings.map { reading in
                switch reading {
                case .row(let row): row.record.name
                case .refused(let name, _): name
                }
            })
        // An account gone from the store (unshared or removed) may come back at version 1.
        seen.withLock { seen in seen = seen.filter { names.contains($0.key) } }
        return readings
    }

    /// The shared account `name`; `nil` when it has no row. A refused row throws why.
    public func read(_ name: String) async throws -> SharedRow? {
        for reading in try await readings("\(unescaped: Self.selection) WHERE name = \(name)") {
            switch reading {
            case .row(let row): return row
            case .refused(_, let reason): throw FleetError("the shared account \(name) was refused: \(reason)")
            }
        }
        seen.withLock { _ = $0.removeValue(forKey: name) }
        return nil
    }

    /// The rows `selecting` (a `selection`) finds, each checked.
    private func readings(_ selecting: PostgresQuery) async throws -> [SharedReading] {
        let rows = try await query(selecting)
        var readings: [SharedReading] = []
        for try await (name, version, sealed, holder, refresher, lapsed) in rows.decode(
            (String, Int64, ByteBuffer, String?, String?, Bool?).self)
        {
            readings.append(reading(name, version, sealed, holder, refresher, lapsed: lapsed == true))
        }
        return readings
    }

    /// Adds `record` as a new shared account at version 1; `false` when the name is taken.
    public func insert(_ record: AccountRecord) async throws -> Bool {
        let sealed = ByteBuffer(bytes: try SharedRecord.seal(record, version: 1, key: key))
        let inserted: Bool
        do {
            let rows = try await query(
                """
                INSERT INTO tokenbroker_accounts (name, version, sealed, last_refreshed_by)
                VALUES (\(record.name), 1, \(sealed), \(host)) ON CONFLICT (name) DO NOTHING RETURNING version
                """)
            inserted = try await rows.decode(Int64.self).first { _ in true } != nil
        } catch let error as PSQLError where error.code == .server {
            let state =
                error.serverInfo?[.sqlState].map {
                    String($0.prefix(5).filter { $0.isASCII && ($0.isLetter || $0.isNumber) })
                } ?? "?"
            // One statement the server answered with an error: nothing was inserted (`share`
            // undoes its mark), unless the error could follow a commit (a session ended: class
            // 57 or 08, an internal error, anything worse than ERROR).
            let refused =
                error.serverInfo?[.severity] == "ERROR" && !["57", "08", "XX"].contains(String(state.prefix(2)))
            throw FleetError("the database did not take the insert (SQLSTATE \(state))", refusedByServer: refused)
        }
        if inserted { note(record.name, 1) }
        return inserted
    }

    /// Takes the lease of `name` for `seconds` when it is free, lapsed or this host's already;
    /// `nil` when another host holds it (or there is no such row). A refused row throws why.
    public func takeLease(_ name: String, seconds: Double) async throws -> SharedLease? {
        // One statement: the lease, and the notification that tells the other brokers a refresh
        // starts (their held access token may be revoked by it).
        let rows = try await query(
            """
            WITH before AS (SELECT lease_holder IS NOT NULL AND lease_until <= now() AS lapsed
            FROM tokenbroker_accounts WHERE name = \(name)),
            taken AS (UPDATE tokenbroker_accounts SET lease_holder = \(holder),
            lease_until = now() + make_interval(secs => \(seconds))
            WHERE name = \(name) AND (lease_holder IS NULL OR lease_until IS NULL OR lease_until <= now() OR lease_holder = \(holder))
            RETURNING version, sealed, last_refreshed_by, EXTRACT(EPOCH FROM lease_until - now())::float8 AS remaining)
            SELECT version, sealed, last_refreshed_by, remaining, (SELECT lapsed FROM before) FROM taken
            CROSS JOIN LATERAL (SELECT pg_notify(\(Self.channel), 'lease ' || \(holder) || ' ' || \(name))) AS told
            """)
        for try await (version, sealed, refresher, remaining, lapsed) in rows.decode(
            (Int64, ByteBuffer, String?, Double, Bool?).self)
        {
            switch reading(name, version, sealed, host, refresher) {
            case .row(let row):
                // The database's figure, bounded before it is converted (a hostile one could be anything).
                let seconds = max(0, Self.seconds(remaining))
                return SharedLease(
                    row: row, remaining: .milliseconds(Int64(seconds * 1000)), replacedLapsed: lapsed == true)
            case .refused(_, let reason):
                await release(name)
                throw FleetError("the shared account \(name) was refused: \(reason)")
            }
        }
        return nil
    }

    /// Ends this host's lease of `name` without a change (a refresh that failed or was not
    /// needed). Best effort: a lease not released lapses.
    public func release(_ name: String) async {
        _ = try? await query(
            """
            WITH freed AS (UPDATE tokenbroker_accounts SET lease_holder = NULL, lease_until = NULL
            WHERE name = \(name) AND lease_holder = \(holder) RETURNING name)
            SELECT pg_notify(\(Self.channel), 'release ' || \(holder) || ' ' || name) FROM freed
            """)
    }

    /// Commits `record` as the version after `version`, only if the row is still at `version`
    /// (compare and swap), ends the lease, and notifies the other brokers. `false` when the row
    /// moved on (or is gone): the caller takes the row's state instead.
    public func commit(_ record: AccountRecord, over version: Int64) async throws -> Bool {
        let next = version + 1
        let sealed = ByteBuffer(bytes: try SharedRecord.seal(record, version: next, key: key))
        let name = record.name
        // One statement, so one round trip: the swap and the notification commit together.
        let rows = try await query(
            """
            WITH moved AS (UPDATE tokenbroker_accounts SET version = \(next), sealed = \(sealed), lease_holder = NULL,
            lease_until = NULL, last_refreshed_by = \(host), updated_at = now()
            WHERE name = \(name) AND version = \(version) RETURNING version)
            SELECT version FROM moved
            CROSS JOIN LATERAL (SELECT pg_notify(\(Self.channel), 'commit ' || \(holder) || ' ' || \(name))) AS told
            """)
        let committed = try await rows.decode(Int64.self).first { _ in true } != nil
        if committed { note(name, next) }
        return committed
    }

    /// The schema version, the hosts seen (the most recent first, at most 1,000) and the leases
    /// held now; seconds by the database's clock, bounded before they are converted.
    public func report() async throws -> FleetReport {
        let schema =
            try await query("SELECT max(version) FROM tokenbroker_schema")
            .decode(Int32?.self).first { _ in true } ?? nil
        var hosts: [FleetReport.Host] = []
        for try await (name, ago) in try await query(
            """
            SELECT host, EXTRACT(EPOCH FROM now() - last_seen)::float8 FROM tokenbroker_hosts
            ORDER BY last_seen DESC LIMIT 1000
            """
        ).decode((String, Double).self) {
            hosts.append(FleetReport.Host(name: Self.hostName(name), seenSecondsAgo: Self.seconds(ago)))
        }
        var leases: [FleetReport.Lease] = []
        for try await (account, holder, left) in try await query(
            """
            SELECT name, lease_holder, EXTRACT(EPOCH FROM lease_until - now())::float8 FROM tokenbroker_accounts
            WHERE lease_holder IS NOT NULL AND lease_until > now() ORDER BY name LIMIT 1000
            """
        ).decode((String, String, Double).self) {
            // A name from the database in clear: only one an account may have is shown.
            guard (try? AccountName(account)) != nil else { continue }
            leases.append(
                FleetReport.Lease(account: account, holder: Self.hostName(holder), secondsLeft: Self.seconds(left)))
        }
        return FleetReport(schema: Int(schema ?? 0), hosts: hosts, leases: leases)
    }

    /// A number of seconds from the database, finite and within a day either way.
    static func seconds(_ value: Double) -> Double {
        value.isFinite ? min(max(value, -86_400), 86_400) : 0
    }

    /// Deletes the row of `name`, only while it is at `version` when one is given; `false` when
    /// there was none (or it was at another version).
    public func delete(_ name: String, at version: Int64?) async throws -> Bool {
        let rows = try await query(
            """
            DELETE FROM tokenbroker_accounts WHERE name = \(name) AND (\(version)::bigint IS NULL OR version = \(version))
            RETURNING version
            """)
        let deleted = try await rows.decode(Int64.self).first { _ in true } != nil
        seen.withLock { _ = $0.removeValue(forKey: name) }
        return deleted
    }

    /// Runs `query`, giving up after the deadline (`FleetDeadline`).
    private func query(_ query: PostgresQuery) async throws -> PostgresRowSequence {
        let (client, logger) = (currentClient, logger)
        return try await FleetDeadline.run(within: deadline) { try await client.query(query, logger: logger) }
    }

    /// The client calls go through now.
    var currentClient: PostgresClient { client.withLock { $0 } }

    /// Sends every later call through `fresh`; returns the client used until now.
    func replaceClient(with fresh: PostgresClient) -> PostgresClient {
        client.withLock { client in
            defer { client = fresh }
            return client
        }
    }

    /// How long a call waits for the database at most.
    var callDeadline: Duration { deadline }

    /// What a notification on `channel` says another broker did; `nil` for this broker's own
    /// and for a payload not of that form.
    public func notice(_ payload: String) -> FleetNotice? {
        let parts = payload.split(separator: " ", maxSplits: 2).map(String.init)
        guard parts.count == 3, parts[1] != holder else { return nil }
        switch parts[0] {
        case "lease": return .leased(parts[2])
        case "release": return .released(parts[2])
        case "commit": return .committed(parts[2])
        default: return nil
        }
    }

    /// Checks one row: it opens as its name and version under the fleet key, and is not older
    /// than the newest version seen of it.
    private func reading(
        _ name: String, _ version: Int64, _ sealed: ByteBuffer, _ holder: String?, _ refresher: String?,
        lapsed: Bool = false
    ) -> SharedReading {
        let newest = seen.withLock { $0[name] ?? 0 }
        guard version >= newest else {
            return .refused(
                name: name,
                reason: "it is at version \(version), older than version \(newest) seen before (rolled back)")
        }
        do {
            let record = try SharedRecord.open(Array(buffer: sealed), name: name, version: version, key: key)
            note(name, version)
            return .row(
                SharedRow(
                    record: record, version: version, leaseHolder: holder.map(Self.hostName),
                    lastRefreshedBy: refresher.map(Self.hostName), leaseLapsed: lapsed))
        } catch {
            return .refused(name: name, reason: String(describing: error))
        }
    }

    /// A host name from a row's text columns, which the fleet key does not seal: the part before
    /// a lease holder's `/`, only the characters a `[fleet] host` may have, at most 64.
    static func hostName(_ text: String) -> String {
        String(
            String.UnicodeScalarView(
                text.unicodeScalars.prefix { $0 != "/" }.filter {
                    $0.isASCII
                        && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || ".-_".unicodeScalars.contains($0))
                }.prefix(64)))
    }

    private func note(_ name: String, _ version: Int64) {
        seen.withLock { $0[name] = max($0[name] ?? 0, version) }
    }
}
