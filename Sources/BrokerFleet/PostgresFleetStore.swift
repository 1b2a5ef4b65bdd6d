import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Logging
import NIOCore
import PostgresNIO
import Synchronization

/// The fleet's shared store in PostgreSQL (docs/fleet.md). Each shared account is a row: its
/// name, its share's id, a version, its record sealed with the fleet key (`SharedRecord`: the
/// name, share and version bound in), the lease holder and the lease's end, set by the
/// database's clock. One broker at a time holds an account's lease and refreshes it; every
/// commit compares and swaps the version, so a holder whose lease lapsed overwrites nothing
/// newer. A removed row leaves its share id in `tokenbroker_removed`. Every row read is checked:
/// one that does not open, is older than a version this broker saw of its share, or belongs to
/// a share this broker saw end, is refused by name and the others are served.
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
    /// What this broker has seen of the rows: kept for as long as it runs, so that a row rolled
    /// back, or brought back after it was removed, is refused even once its name is gone.
    private let seen = Mutex(Seen())

    struct Seen {
        /// The share of each account's row last read.
        var shares: [String: String] = [:]
        /// The highest version seen of each share.
        var floors: [String: Int64] = [:]
        /// The shares whose row was seen gone (removed or unshared, or replaced by another share).
        var ended: Set<String> = []
    }

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
        "SELECT name, share_id, version, sealed, CASE WHEN lease_until > now() THEN lease_holder END, "
        + "last_refreshed_by, lease_holder IS NOT NULL AND lease_until <= now(), "
        + "EXISTS (SELECT 1 FROM tokenbroker_removed r WHERE r.share_id = tokenbroker_accounts.share_id), "
        + "CASE WHEN lease_until > now() THEN EXTRACT(EPOCH FROM lease_until - now())::float8 END "
        + "FROM tokenbroker_accounts"

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
        // An account gone from the store was removed or unshared: its share has ended.
        seen.withLock { seen in
            for (name, share) in seen.shares where !names.contains(name) { seen.end(name, share) }
        }
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
        seen.withLock { seen in seen.shares[name].map { seen.end(name, $0) } }
        return nil
    }

    /// The rows `selecting` (a `selection`) finds, each checked.
    private func readings(_ selecting: PostgresQuery) async throws -> [SharedReading] {
        let rows = try await query(selecting)
        var readings: [SharedReading] = []
        for try await (name, share, version, sealed, holder, refresher, lapsed, removed, left) in rows.decode(
            (String, String, Int64, ByteBuffer, String?, String?, Bool?, Bool, Double?).self)
        {
            readings.append(
                reading(
                    name, share, version, sealed, holder, refresher, lapsed: lapsed == true, removed: removed,
                    left: left.map(Self.seconds)))
        }
        return readings
    }

    /// Adds `record` as a new shared account at version 1, of share `share`; `false` when the
    /// name is taken, or the share was removed already (a late retry of its insert).
    public func insert(_ record: AccountRecord, share: String) async throws -> Bool {
        let sealed = ByteBuffer(bytes: try SharedRecord.seal(record, share: share, version: 1, key: key))
        let inserted: Bool
        do {
            let rows = try await query(
                """
                INSERT INTO tokenbroker_accounts (name, share_id, version, sealed, last_refreshed_by)
                SELECT \(record.name), \(share), 1, \(sealed), \(host)
                WHERE NOT EXISTS (SELECT 1 FROM tokenbroker_removed WHERE share_id = \(share))
                ON CONFLICT (name) DO NOTHING RETURNING version
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
        if inserted { seen.withLock { $0.note(record.name, share, 1) } }
        return inserted
    }

    /// Whether the share `share` had a row that was since removed or unshared.
    public func shareEnded(_ share: String) async throws -> Bool {
        try await query("SELECT EXISTS (SELECT 1 FROM tokenbroker_removed WHERE share_id = \(share))")
            .decode(Bool.self).first { _ in true } ?? false
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
            RETURNING share_id, version, sealed, last_refreshed_by,
            EXTRACT(EPOCH FROM lease_until - now())::float8 AS remaining)
            SELECT share_id, version, sealed, last_refreshed_by, remaining, (SELECT lapsed FROM before),
            EXISTS (SELECT 1 FROM tokenbroker_removed r WHERE r.share_id = taken.share_id) FROM taken
            CROSS JOIN LATERAL (SELECT pg_notify(\(Self.channel), 'lease ' || \(holder) || ' ' || \(name))) AS told
            """)
        for try await (share, version, sealed, refresher, remaining, lapsed, removed) in rows.decode(
            (String, Int64, ByteBuffer, String?, Double, Bool?, Bool).self)
        {
            switch reading(name, share, version, sealed, host, refresher, removed: removed) {
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

    /// Commits `record` as the version after `version`, only if the row is still of share
    /// `share` at `version` (compare and swap), ends the lease, and notifies the other brokers.
    /// `false` when the row moved on (or is gone, or of another share): the caller takes the
    /// row's state instead.
    public func commit(_ record: AccountRecord, share: String, over version: Int64) async throws -> Bool {
        let next = version + 1
        let name = record.name
        let sealed = ByteBuffer(bytes: try SharedRecord.seal(record, share: share, version: next, key: key))
        // One statement, so one round trip: the swap and the notification commit together.
        let rows = try await query(
            """
            WITH moved AS (UPDATE tokenbroker_accounts SET version = \(next), sealed = \(sealed), lease_holder = NULL,
            lease_until = NULL, last_refreshed_by = \(host), updated_at = now()
            WHERE name = \(name) AND share_id = \(share) AND version = \(version) RETURNING version)
            SELECT version FROM moved
            CROSS JOIN LATERAL (SELECT pg_notify(\(Self.channel), 'commit ' || \(holder) || ' ' || \(name))) AS told
            """)
        let committed = try await rows.decode(Int64.self).first { _ in true } != nil
        if committed { seen.withLock { $0.note(name, share, next) } }
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
        // One statement: the row goes and its share is noted as ended, together.
        let rows = try await query(
            """
            WITH gone AS (DELETE FROM tokenbroker_accounts
            WHERE name = \(name) AND (\(version)::bigint IS NULL OR version = \(version))
            RETURNING share_id, name, version),
            noted AS (INSERT INTO tokenbroker_removed (share_id, name, version)
            SELECT share_id, name, version FROM gone ON CONFLICT (share_id) DO NOTHING)
            SELECT share_id FROM gone
            """)
        guard let share = try await rows.decode(String.self).first(where: { _ in true }) else { return false }
        seen.withLock { $0.end(name, share) }
        return true
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

    /// Checks one row: its share is not one seen to end here or noted as removed in the
    /// database, it opens as its name, share and version under the fleet key, and is not older
    /// than the newest version seen of its share.
    private func reading(
        _ name: String, _ share: String, _ version: Int64, _ sealed: ByteBuffer, _ holder: String?,
        _ refresher: String?, lapsed: Bool = false, removed: Bool, left: Double? = nil
    ) -> SharedReading {
        guard SharedRecord.isShareID(share) else { return .refused(name: name, reason: "its share id is malformed") }
        let (newest, ended) = seen.withLock { ($0.floors[share] ?? 0, $0.ended.contains(share)) }
        guard !ended, !removed else {
            return .refused(name: name, reason: "it belongs to a share that was removed (brought back)")
        }
        guard version >= newest else {
            return .refused(
                name: name,
                reason: "it is at version \(version), older than version \(newest) seen before (rolled back)")
        }
        do {
            let record = try SharedRecord.open(
                Array(buffer: sealed), name: name, share: share, version: version, key: key)
            seen.withLock { $0.note(name, share, version) }
            return .row(
                SharedRow(
                    record: record, share: share, version: version, leaseHolder: holder.map(Self.hostName),
                    lastRefreshedBy: refresher.map(Self.hostName), leaseLapsed: lapsed, leaseRemaining: left))
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

}

extension PostgresFleetStore.Seen {
    /// `name`'s row is of `share`, at `version` at least; another share it had has ended.
    mutating func note(_ name: String, _ share: String, _ version: Int64) {
        if let earlier = shares[name], earlier != share { ended.insert(earlier) }
        shares[name] = share
        floors[share] = max(floors[share] ?? 0, version)
    }

    /// `name`'s row of `share` is gone.
    mutating func end(_ name: String, _ share: String) {
        if shares[name] == share { shares[name] = nil }
        ended.insert(share)
    }
}
