import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// One account as it stands: its state and schedule, never a secret or a token.
public struct AccountSnapshot: Sendable, Equatable {
    public var name: AccountName
    /// The provider kind (`oauth2`, `static`, ...).
    public var kind: String
    public var state: AccountState
    public var expiresAt: Date?
    public var refreshExpiresAt: Date?
    public var nextRefreshAt: Date?
    public var lastRefreshAt: Date?
    /// What the last failed refresh met, cleared by a success or new tokens.
    public var lastError: AccountError?
    /// The scopes the IdP no longer grants the account's own token (`AccountRecord.lostScope`).
    public var lostScope: [String]?
    /// For a shared account (docs/fleet.md): what its row says.
    public var shared: SharedAccountStatus?
    /// For an account whose tokens are bound to a DPoP key: the key's public facts.
    public var dpop: DPoPStatus?
    /// For an account that serves no token, or whose refreshes fail: what brings it back.
    public var restoration: Restoration? = nil

    /// This snapshot as `degraded` when `degraded` holds (a shared account whose last refresh
    /// the fleet's database has not taken yet) and the account is not refreshing.
    package func degraded(_ degraded: Bool) -> AccountSnapshot {
        var snapshot = self
        if degraded, snapshot.state != .refreshing { snapshot.state = .degraded }
        return snapshot
    }
}

/// A shared account's row as `status` shows it.
public struct SharedAccountStatus: Sendable, Equatable {
    public var version: Int64
    /// The host that committed the row last.
    public var lastRefreshedBy: String?
    /// This host's name while it holds the account's lease.
    public var leaseHolder: String?
}

/// An account's DPoP key as `status` shows it: nothing of the private key.
public struct DPoPStatus: Sendable, Equatable {
    /// The algorithm, `ES256`.
    public var algorithm: String
    /// The public key's RFC 7638 thumbprint, base64url: the `cnf.jkt` of the tokens bound to it.
    public var thumbprint: String
    /// Whether the IdP answered the last DPoP request with a token of another type (`Bearer`):
    /// an IdP that ignores DPoP. The account keeps working with what it issued.
    public var otherTokenType: String?
}

/// The state of an account.
public enum AccountState: String, Sendable {
    case valid, refreshing, stale, unavailable, degraded
    /// Its record in the vault cannot be read by this release (`DamagedRecord`).
    case damaged
    case needsLogin = "needs_login"
    case loggedOut = "logged_out"
}

/// What `logout` did with the account's credential; the account is logged out in every case.
public enum LogoutOutcome: Sendable, Equatable {
    /// The IdP confirmed the revocation.
    case revoked
    /// Discarded without revocation: the provider has none, or the logout was forced.
    case discarded
    /// The account was already logged out; nothing changed.
    case alreadyLoggedOut
}

extension AccountRecord {
    /// The DPoP key's public facts for `status`, with the type of the current token when an IdP
    /// issued one that is not `DPoP` (pushed tokens are what the owner gave, not reported).
    package var dpopStatus: DPoPStatus? {
        guard let key = dpopKey else { return nil }
        let type = token.flatMap { $0.pushed == true || TokenType.isDPoP($0.type) ? nil : $0.type }
        return DPoPStatus(algorithm: DPoPKey.algorithm, thumbprint: key.thumbprint, otherTokenType: type)
    }
}
