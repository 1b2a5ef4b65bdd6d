import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// Every bound the server puts on what local clients may make it hold, in one place.
///
/// The same kinds of bound dbus-daemon keeps (pending replies and match rules per connection,
/// connections per user, a deadline for a half-done handshake), sized for a per-user broker
/// whose clients ask for a token, read it and go. A client over a count limit gets `busy` with `retry_after_ms`
/// (or, for a connection, that line and then the close); one that stops reading is simply no
/// longer read from. Worst case for one uid, every connection stuffed: 1024 x (read buffer +
/// `partialLineAllowance` + `writeBufferHighWater` + ~20 KiB of channel and task) plus
/// `partialLineBudget`, some 55 MiB; `bench/run flood` measures a realistic flood.
public struct ConnectionLimits: Sendable {
    /// Requests one connection may have running on the broker at once (cached tokens and
    /// errors are answered inline and never count). Further lines wait in the socket: the
    /// broker stops reading until an answer is written.
    public var requestsPerConnection = 64
    /// Requests all connections of one uid may have running at once; over it a request gets `busy`.
    public var requestsPerUID = 1024
    /// Subscriptions one connection may hold; over it `subscribe` gets `busy`.
    public var subscriptionsPerConnection = 64
    /// Subscriptions all connections of one uid may hold; over it `subscribe` gets `busy`.
    public var subscriptionsPerUID = 1024
    /// Open connections per uid; a connection over it gets `busy` and is closed.
    public var connectionsPerUID = 1024
    /// Open connections in all; lowered at start to leave descriptors for the IdPs and vault.
    public var connections = 4096
    /// Answer bytes queued for a peer above which the broker stops reading from it (the channel's
    /// high-water mark); it reads again below `writeBufferLowWater`.
    public var writeBufferHighWater = 8 * 1024
    /// See `writeBufferHighWater`.
    public var writeBufferLowWater = 4 * 1024
    /// The most one read takes from a peer (NIO's adaptive receive buffer grows up to this;
    /// one read per wake-up), so a connection that may take no more work holds at most this
    /// much besides a half-sent line.
    public var readBufferLimit = 8 * 1024
    /// Received bytes a connection may hold (a half-sent line, or lines it has not taken yet)
    /// without drawing on `partialLineBudget`: every ordinary request line, and one read more.
    public var partialLineAllowance = 16 * 1024
    /// Received bytes beyond their allowance that all connections together may hold. A line
    /// that would overdraw it gets `busy` and its connection is closed.
    public var partialLineBudget = 2 * 1024 * 1024
    /// How long a line may take from its first byte to its `\n`; then the connection is closed
    /// (`line_timeout`).
    public var lineTimeout: TimeAmount = .seconds(10)
    /// How long a connection may sit with nothing to do (no request running, no subscription,
    /// no half-sent line) before the broker closes it (`idle_connection_timeout`). Subscribers
    /// are never idle.
    public var idleTimeout: TimeAmount = .seconds(300)
    /// How long a closing connection may take to deliver what it still owes the peer (the
    /// answers to running requests at shutdown, a last error line) before it is closed anyway.
    public var drainTimeout: TimeAmount = .seconds(5)
    /// The `retry_after_ms` sent with every `busy` for a limit.
    public var retryAfterMs = 1000

    public init() {}

    /// The standard limits with the two timeouts `settings` gives (`line_timeout`,
    /// `idle_connection_timeout`), and the connection total fitted under the open-file limit.
    public static func standard(settings: BrokerSettings) -> ConnectionLimits {
        var limits = ConnectionLimits()
        limits.lineTimeout = .milliseconds(Int64(Bounds.milliseconds(settings.lineTimeout)))
        limits.idleTimeout = .milliseconds(Int64(Bounds.milliseconds(settings.idleConnectionTimeout)))
        var files = rlimit()
        if getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &files) == 0 {
            // Keep 256 descriptors for everything that is not a client connection.
            limits.connections = max(64, min(limits.connections, Int(clamping: files.rlim_cur) - 256))
        }
        return limits
    }
}
