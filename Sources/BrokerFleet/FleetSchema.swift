import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Logging
import PostgresNIO

/// The tables of the shared store and how a broker makes or checks them (docs/fleet.md,
/// "Schema"): all in one transaction under an advisory lock, so brokers starting together make
/// them once. The canary is checked before anything is written: a broker holding another
/// fleet's key writes nothing.
enum FleetSchema {
    /// The schema this brokerd makes and reads. Version 2 changes no table: it marks a fleet
    /// whose brokers keep the members of a row's record they do not know, so a release before
    /// that rule, which would drop them, refuses it at start (docs/fleet.md, "Schema").
    static let version: Int32 = 2
    /// The advisory lock that serializes the schema's making ("tokenbrk").
    static let lockKey: Int64 = 0x746f_6b65_6e62_726b

    /// The statements that take a database from schema version `index` to `index + 1`.
    static let migrations: [[String]] = [
        [
            "CREATE TABLE tokenbroker_schema (version integer NOT NULL)",
            "CREATE TABLE tokenbroker_meta (key text PRIMARY KEY, value bytea NOT NULL)",
            """
            CREATE TABLE tokenbroker_accounts (
                name text PRIMARY KEY,
                share_id text NOT NULL,
                version bigint NOT NULL CHECK (version >= 1),
                sealed bytea NOT NULL,
                lease_holder text,
                lease_until timestamptz,
                last_refreshed_by text,
                updated_at timestamptz NOT NULL DEFAULT now()
            )
            """,
            "CREATE TABLE tokenbroker_hosts (host text PRIMARY KEY, last_seen timestamptz NOT NULL)",
            """
            CREATE TABLE tokenbroker_removed (
                share_id text PRIMARY KEY,
                name text NOT NULL,
                version bigint NOT NULL,
                removed_at timestamptz NOT NULL DEFAULT now()
            )
            """,
        ],
        [
            """
            COMMENT ON TABLE tokenbroker_accounts IS
                'sealed: records whose members a release does not know are kept byte for byte (docs/fleet.md)'
            """
        ],
    ]

    /// Makes the schema in an empty database (with a canary sealed by `key`), or checks the
    /// canary of an existing one and brings it to `version`. Throws, having written nothing,
    /// when the canary does not open under `key` or the schema is newer than this brokerd's.
    /// Returns the schema version in force.
    static func prepare(_ client: PostgresClient, key: SecretKey, logger: Logger) async throws -> Int32 {
        try await FleetTransaction.run(client, logger: logger) { connection in
            try await connection.query("SELECT pg_advisory_xact_lock(\(lockKey))", logger: logger)
            let exists =
                try await connection.query(
                    "SELECT to_regclass('tokenbroker_schema') IS NOT NULL", logger: logger
                ).decode(Bool.self).first { _ in true } ?? false
            var current: Int32 = 0
            if exists {
                let canary = try await connection.query(
                    "SELECT value FROM tokenbroker_meta WHERE key = 'canary'", logger: logger
                ).decode(ByteBuffer.self).first { _ in true }
                guard let canary, FleetCanary.opens(Array(buffer: canary), key: key) else {
                    throw FleetError(
                        "the fleet key does not open this database's canary: it belongs to another fleet"
                            + " (install the key `brokerctl fleet init` made for this database); nothing was written")
                }
                current =
                    try await connection.query("SELECT max(version) FROM tokenbroker_schema", logger: logger)
                    .decode(Int32?.self).first { _ in true }.flatMap { $0 } ?? 0
                guard current >= 0 else {
                    throw FleetError("the database's schema version (\(current)) is not one brokerd made")
                }
                guard current <= version else {
                    throw FleetError(
                        "the database's schema is version \(current), newer than this brokerd's (\(version)): upgrade brokerd"
                    )
                }
            }
            guard current < version else { return current }
            for statement in migrations[Int(current)...].joined() {
                try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
            }
            if current == 0 {
                let canary = ByteBuffer(bytes: FleetCanary.make(key: key))
                try await connection.query(
                    "INSERT INTO tokenbroker_meta (key, value) VALUES ('canary', \(canary))", logger: logger)
                try await connection.query(
                    "INSERT INTO tokenbroker_schema (version) VALUES (\(version))", logger: logger)
            } else {
                try await connection.query("UPDATE tokenbroker_schema SET version = \(version)", logger: logger)
            }
            return version
        }
    }
}
