import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault

/// A shared account as its row holds it (docs/fleet.md, "Rows").
public struct SharedRow: Sendable {
    public let record: AccountRecord
    /// The share the row belongs to (`SharedRecord.newShareID`): set when the account was
    /// shared, never changed by a commit.
    public let share: String
    /// Grows by one with every commit; the same on every host once they have read it.
    public let version: Int64
    /// The host holding the account's lease while the lease runs.
    public let leaseHolder: String?
    /// The host that committed the row last.
    public let lastRefreshedBy: String?
    /// A lease was taken and ran out, neither released nor ended by a commit: its holder may
    /// have rotated the credential and not committed.
    public let leaseLapsed: Bool
    /// How long the running lease has left, by the database's clock (`nil`: none runs), so that
    /// a broker waiting for its end reads the row again as it runs out.
    public let leaseRemaining: Double?

    public init(
        record: AccountRecord, share: String, version: Int64, leaseHolder: String?, lastRefreshedBy: String?,
        leaseLapsed: Bool = false, leaseRemaining: Double? = nil
    ) {
        self.leaseRemaining = leaseRemaining
        self.record = record
        self.share = share
        self.version = version
        self.leaseHolder = leaseHolder
        self.lastRefreshedBy = lastRefreshedBy
        self.leaseLapsed = leaseLapsed
    }
}

/// A lease taken: the row as it was when taken, and how long the lease runs from then.
public struct SharedLease: Sendable {
    public let row: SharedRow
    public let remaining: Duration
    /// The lease this one replaced had run out, neither released nor ended by a commit.
    public let replacedLapsed: Bool

    public init(row: SharedRow, remaining: Duration, replacedLapsed: Bool = false) {
        self.row = row
        self.remaining = remaining
        self.replacedLapsed = replacedLapsed
    }
}

/// What reading one row gave: the row, or why it was refused (never a secret).
public enum SharedReading: Sendable {
    case row(SharedRow)
    case refused(name: String, reason: String)
}

/// What another broker of the fleet did to a shared account, as its notification says
/// (docs/fleet.md, "Notifications"); a broker's own are not told to it.
public enum FleetNotice: Sendable, Equatable {
    /// It took the account's lease: its refresh starts, and the IdP may revoke the access token
    /// held (as django-oauth-toolkit does at each rotation).
    case leased(String)
    /// It ended its lease without a change (its refresh failed or was not needed).
    case released(String)
    /// It committed a new version of the row.
    case committed(String)
}

/// Where the fleet's shared accounts live; the engine reads and writes them only through this
/// (the PostgreSQL store, `BrokerFleet.PostgresFleetStore`). Every row read is checked: one
/// that does not open, or is older than a version seen, is refused.
public protocol SharedAccountStore: Sendable {
    /// This broker's name in the rows (`[fleet] host`).
    var host: String { get }
    /// Every shared account, each row checked on its own.
    func readAll() async throws -> [SharedReading]
    /// The shared account `name`; `nil` when it has no row. A refused row throws why.
    func read(_ name: String) async throws -> SharedRow?
    /// Adds `record` as a new shared account at version 1, of share `share`; `false` when the
    /// name is taken, or that share was removed already (a late retry of its insert).
    func insert(_ record: AccountRecord, share: String) async throws -> Bool
    /// Whether the share `share` had a row that was since removed or unshared.
    func shareEnded(_ share: String) async throws -> Bool
    /// Takes `name`'s lease for `seconds` when it is free, lapsed or this host's already; `nil`
    /// when another host holds it or there is no such row.
    func takeLease(_ name: String, seconds: Double) async throws -> SharedLease?
    /// Ends this host's lease of `name` without a change.
    func release(_ name: String) async
    /// Commits `record` as the version after `version` if the row is still of share `share` at
    /// `version`, and ends the lease; `false` when the row moved on or is gone.
    func commit(_ record: AccountRecord, share: String, over version: Int64) async throws -> Bool
    /// The schema version, the hosts seen and the leases held now.
    func report() async throws -> FleetReport
    /// Deletes the row of `name`, only while it is at `version` when one is given, and notes its
    /// share as ended; `false` when there was none (or it was at another version).
    func delete(_ name: String, at version: Int64?) async throws -> Bool
}

/// What the fleet's database holds about the fleet itself (`brokerctl fleet status`); seconds
/// by the database's clock.
public struct FleetReport: Sendable, Equatable {
    public struct Host: Sendable, Equatable {
        public var name: String
        public var seenSecondsAgo: Double
        public init(name: String, seenSecondsAgo: Double) {
            self.name = name
            self.seenSecondsAgo = seenSecondsAgo
        }
    }

    public struct Lease: Sendable, Equatable {
        public var account: String
        public var holder: String
        public var secondsLeft: Double
        public init(account: String, holder: String, secondsLeft: Double) {
            self.account = account
            self.holder = holder
            self.secondsLeft = secondsLeft
        }
    }

    public var schema: Int
    /// The most recently seen first.
    public var hosts: [Host]
    public var leases: [Lease]

    public init(schema: Int, hosts: [Host], leases: [Lease]) {
        self.schema = schema
        self.hosts = hosts
        self.leases = leases
    }
}

/// The fleet as this broker sees it: its host, and the database's report or why there is none.
public struct FleetStanding: Sendable {
    public var host: String
    public var report: Result<FleetReport, FleetError>
    /// The shared accounts this broker serves.
    public var sharedAccounts: Int
}
