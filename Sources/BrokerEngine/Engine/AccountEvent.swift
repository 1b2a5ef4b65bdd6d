import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// One change in an account's life, for subscribers. Never carries a token.
public struct AccountEvent: Sendable, Equatable {
    /// What happened.
    public enum Kind: Sendable, Equatable {
        case refreshed, refreshFailed, needsLogin, loggedOut, added, removed
        /// Usable again after `needsLogin`, `loggedOut` or `refreshFailed` (protocol/PROTOCOL.md, `subscribe`).
        case valid
    }

    public var kind: Kind
    public var account: AccountName
    public var at: Date
    /// The account's state after the change (`nil` once it was removed).
    public var state: AccountState?
    /// What went wrong (`refreshFailed`, `needsLogin`), for people; already cleaned.
    public var message: String?
    /// When the new access token expires (`refreshed`, `valid`).
    public var expiresAt: Date?
}
