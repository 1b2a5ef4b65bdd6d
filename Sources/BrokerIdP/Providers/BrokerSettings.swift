import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// Tunables of the refresh engine; every field has a sensible default.
public struct BrokerSettings: Sendable, Equatable {
    /// Refresh when this fraction of a token's lifetime remains (before jitter).
    public var refreshFraction: Double = 0.25
    /// Jitter applied to the refresh point, as a fraction of the lifetime (±).
    public var refreshJitter: Double = 0.05
    /// Refresh no later than this many seconds before expiry (capped at half the lifetime).
    public var refreshFloor: TimeInterval = 60
    /// Shortest time between two scheduled refreshes of one account, in seconds.
    public var minimumRefreshInterval: TimeInterval = 1
    /// A refresh this many seconds past due counts as overdue (after a suspend or a clock jump).
    public var overdueThreshold: TimeInterval = 5
    /// Overdue refreshes are spread at random over this many seconds.
    public var overdueSpread: TimeInterval = 10
    /// First retry delay after a transient failure, in seconds; doubles each time.
    public var backoffBase: TimeInterval = 1
    /// Longest retry delay after transient failures, in seconds.
    public var backoffCap: TimeInterval = 300
    /// While an account backs off, a client's request may try the IdP again once per this many
    /// seconds (one call for all such requests), so a recovered IdP is noticed without waiting
    /// out the backoff.
    public var outageProbeInterval: TimeInterval = 2
    /// Connect timeout for IdP calls, in seconds.
    public var connectTimeout: TimeInterval = 5
    /// Total timeout for one IdP call, in seconds.
    public var requestTimeout: TimeInterval = 30
    /// Lifetime assumed when an IdP omits `expires_in`, in seconds.
    public var defaultLifetime: TimeInterval = 600
    /// Events a `subscribe` connection may have unread before it is dropped (a count).
    public var eventBuffer: Double = 1024
    /// `min_ttl` used when a request gives none, in seconds.
    public var defaultMinTTL: TimeInterval = 30
    /// How long a client's line may take from its first byte to its end, in seconds.
    public var lineTimeout: TimeInterval = 10
    /// How long a client's connection may sit with nothing to do before it is closed, in seconds.
    public var idleConnectionTimeout: TimeInterval = 300
    /// Whether brokerd shows a desktop notification when an account needs a login.
    public var desktopNotifications = true

    public init() {}
}
