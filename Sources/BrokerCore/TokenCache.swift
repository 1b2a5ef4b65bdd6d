import BrokerProtocol
import FoundationEssentials
import Synchronization

/// Current tokens by account, readable from any thread without touching the broker actor.
///
/// The broker publishes a token here only after the vault holds the refresh credential that
/// came with it, so whatever is read here is already durable.
public final class TokenCache: Sendable {
    private let tokens = Mutex<[String: PreparedToken]>([:])

    public init() {}

    /// The cached token of `account` if it stays valid for `minTTL` seconds after `now`.
    public func token(for account: String, minTTL: TimeInterval, now: Date) -> PreparedToken? {
        guard let token = tokens.withLock({ $0[account] }),
            token.result.expiresAt.timeIntervalSince(now) >= minTTL
        else { return nil }
        return token
    }

    func publish(_ token: PreparedToken?, for account: String) {
        tokens.withLock { $0[account] = token }
    }

    /// Forgets every token (the broker locks).
    func removeAll() {
        tokens.withLock { $0.removeAll() }
    }
}
