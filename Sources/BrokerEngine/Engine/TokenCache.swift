import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Synchronization

/// Current tokens by account, readable from any thread without touching the broker actor.
///
/// The broker publishes a token here only after the vault holds the refresh credential that
/// came with it, so whatever is read here is already durable. Besides each account's own token,
/// it holds the account's narrowed tokens (`TokenKey`), in memory only.
public final class TokenCache: Sendable {
    private struct Entries {
        /// Each account's own token.
        var tokens: [String: PreparedToken] = [:]
        /// Narrowed tokens, by account and key.
        var narrowed: [String: [TokenKey: PreparedToken]] = [:]
    }

    /// Most narrowed tokens kept per account; a new one beyond it evicts the one expiring first.
    package static let maximumNarrowedTokens = 64

    private let entries = Mutex(Entries())

    public init() {}

    /// The cached token of `account` if it stays valid for `minTTL` seconds after `now`.
    public func token(for account: String, minTTL: TimeInterval, now: Date) -> PreparedToken? {
        guard let token = entries.withLock({ $0.tokens[account] }), Self.lasts(token, minTTL, now) else { return nil }
        return token
    }

    /// The cached token of `account` for `key` if it stays valid for `minTTL` seconds after `now`.
    public func token(for account: String, key: TokenKey, minTTL: TimeInterval, now: Date) -> PreparedToken? {
        if key.isAccount { return token(for: account, minTTL: minTTL, now: now) }
        guard let token = entries.withLock({ $0.narrowed[account]?[key] }), Self.lasts(token, minTTL, now) else {
            return nil
        }
        return token
    }

    /// Whether the token of `account` for `key` is `accessToken`.
    package func holds(_ accessToken: SecretBytes, for account: String, key: TokenKey) -> Bool {
        entries.withLock { $0.narrowed[account]?[key]?.token.value == accessToken }
    }

    /// Serves `token` as the account's own; `nil` withdraws it and every narrowed token of the account.
    package func publish(_ token: PreparedToken?, for account: String) {
        entries.withLock {
            $0.tokens[account] = token
            if token == nil { $0.narrowed[account] = nil }
        }
    }

    /// Serves `token` for `key` of `account` (`nil`: serves none), dropping the account's
    /// narrowed tokens that expired by `now`.
    package func publish(_ token: PreparedToken?, for account: String, key: TokenKey, now: Date) {
        entries.withLock { entries in
            var narrowed = (entries.narrowed[account] ?? [:]).filter { $0.value.expiresAt > now }
            narrowed[key] = token
            if narrowed.count > Self.maximumNarrowedTokens,
                let first = narrowed.filter({ $0.key != key }).min(by: {
                    $0.value.expiresAt < $1.value.expiresAt
                })
            {
                narrowed[first.key] = nil
            }
            entries.narrowed[account] = narrowed.isEmpty ? nil : narrowed
        }
    }

    /// Forgets the token of `account` for `key` if it is `accessToken` (a resource server
    /// refused it); `false` when the cache holds another one or none.
    package func withdraw(_ accessToken: SecretBytes, for account: String, key: TokenKey) -> Bool {
        entries.withLock { entries in
            guard entries.narrowed[account]?[key]?.token.value == accessToken else { return false }
            entries.narrowed[account]?[key] = nil
            return true
        }
    }

    /// Forgets the narrowed tokens of `account` (its credential was replaced).
    package func withdrawNarrowed(for account: String) {
        entries.withLock { $0.narrowed[account] = nil }
    }

    /// Forgets every token (the broker locks).
    package func removeAll() {
        entries.withLock { $0 = Entries() }
    }

    private static func lasts(_ token: PreparedToken, _ minTTL: TimeInterval, _ now: Date) -> Bool {
        token.expiresAt.timeIntervalSince(now) >= minTTL
    }
}
