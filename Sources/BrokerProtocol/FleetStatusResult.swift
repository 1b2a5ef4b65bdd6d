/// The result of `fleet_status` (protocol/PROTOCOL.md): the fleet's database as this broker
/// sees it. Times are seconds, measured by the database's clock.
public struct FleetStatusResult: Codable, Sendable, Equatable {
    /// This broker's `[fleet] host`.
    public var host: String
    /// Whether the database answered just now.
    public var reachable: Bool
    /// Why it did not, when it did not (never a password or a secret).
    public var reason: String?
    /// The schema version of the database's tables.
    public var schema: Int?
    /// The shared accounts this broker serves.
    public var sharedAccounts: Int
    /// The hosts that noted themselves in the database, the most recently seen first.
    public var hosts: [FleetHost]
    /// The leases held now.
    public var leases: [FleetLease]

    public init(
        host: String, reachable: Bool, reason: String? = nil, schema: Int? = nil, sharedAccounts: Int,
        hosts: [FleetHost] = [], leases: [FleetLease] = []
    ) {
        self.host = host
        self.reachable = reachable
        self.reason = reason
        self.schema = schema
        self.sharedAccounts = sharedAccounts
        self.hosts = hosts
        self.leases = leases
    }

    enum CodingKeys: String, CodingKey {
        case host, reachable, reason, schema, hosts, leases
        case sharedAccounts = "shared_accounts"
    }
}

/// A host of the fleet and how long ago it last noted itself.
public struct FleetHost: Codable, Sendable, Equatable {
    public var host: String
    public var seenSecondsAgo: Double

    public init(host: String, seenSecondsAgo: Double) {
        self.host = host
        self.seenSecondsAgo = seenSecondsAgo
    }

    enum CodingKeys: String, CodingKey {
        case host
        case seenSecondsAgo = "seen_seconds_ago"
    }
}

/// A shared account's lease: who holds it and for how much longer.
public struct FleetLease: Codable, Sendable, Equatable {
    public var account: String
    public var holder: String
    public var secondsLeft: Double

    public init(account: String, holder: String, secondsLeft: Double) {
        self.account = account
        self.holder = holder
        self.secondsLeft = secondsLeft
    }

    enum CodingKeys: String, CodingKey {
        case account, holder
        case secondsLeft = "seconds_left"
    }
}
