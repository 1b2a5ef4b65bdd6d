import BrokerProtocol
import FoundationEssentials

/// How an account is refreshed: validated provider settings (no secrets).
public enum ProviderConfig: Codable, Sendable, Equatable {
    case oauth2(OAuth2Settings)
    case refreshURL(RefreshURLSettings)
    case sliding(SlidingSettings)
    case exec(ExecSettings)
    case `static`

    /// The provider's kind as the protocol names it.
    public var kind: String {
        switch self {
        case .oauth2: return "oauth2"
        case .refreshURL: return "refresh_url"
        case .sliding: return "sliding"
        case .exec: return "exec"
        case .static: return "static"
        }
    }
}

/// Settings of an `oauth2` account (RFC 6749 section 6 refresh grant).
public struct OAuth2Settings: Codable, Sendable, Equatable {
    /// How the client authenticates at the token endpoint.
    public enum ClientAuth: String, Codable, Sendable {
        case clientSecretBasic = "client_secret_basic"
        case clientSecretPost = "client_secret_post"
        case none
    }

    /// Where refresh grants go; `nil` when it is discovered from `issuer`.
    public var tokenEndpoint: URL?
    public var clientID: String
    public var clientAuth: ClientAuth
    public var scope: String?
    /// An OIDC issuer whose discovery document names the token endpoint (used when
    /// `tokenEndpoint` is `nil`).
    public var issuer: URL? = nil
    /// Where `logout` revokes the refresh token (RFC 7009); discovered from `issuer` when `nil`.
    public var revocationEndpoint: URL? = nil
}

/// The current access token of an account.
public struct AccessToken: Codable, Sendable, Equatable {
    public var value: String
    public var type: String
    public var expiresAt: Date
    /// When the broker received it; with `expiresAt` it gives the token's lifetime.
    public var obtainedAt: Date
    public var idToken: String?
    public var scope: String?
    /// Pushed by a person (`add`, `set_tokens`) rather than issued to the broker by the IdP,
    /// so its lifetime says nothing about what the IdP grants.
    public var pushed: Bool?

    /// Seconds the token stays valid after `now`.
    public func remaining(at now: Date) -> TimeInterval { expiresAt.timeIntervalSince(now) }
}

/// Refresh credentials and client secrets: only ever in memory and in the vault.
public struct AccountSecrets: Codable, Sendable, Equatable {
    public var refreshToken: String?
    /// The refresh credential of `refresh_url` accounts: a one-time URL.
    public var refreshURL: String?
    public var refreshExpiresAt: Date?
    public var clientSecret: String?
}

/// Everything the vault keeps about one account.
public struct AccountRecord: Codable, Sendable, Equatable {
    public var name: String
    public var provider: ProviderConfig
    public var secrets: AccountSecrets
    public var token: AccessToken?
    /// Set when the IdP denied the refresh; cleared only by new tokens.
    public var needsLogin: Bool
    /// Set by `logout`, which discarded every token; cleared only by new tokens. `nil` in older vaults.
    public var loggedOut: Bool?
    public var lastError: AccountError?
    public var lastRefreshAt: Date?
    /// Declared in the config file (its provider settings come from there); `nil` in older vaults.
    public var declared: Bool?

    /// This record with every date within `Bounds.representableDates` and its last error
    /// cleaned, so a vault written before numbers and texts were checked still loads,
    /// schedules and shows nothing secret.
    func sanitized() -> AccountRecord {
        var record = self
        if var token = record.token {
            token.expiresAt = Bounds.date(token.expiresAt)
            token.obtainedAt = Bounds.date(token.obtainedAt)
            record.token = token
        }
        record.secrets.refreshExpiresAt = record.secrets.refreshExpiresAt.map { Bounds.date($0) }
        record.lastRefreshAt = record.lastRefreshAt.map { Bounds.date($0) }
        if var error = record.lastError {
            error.at = Bounds.date(error.at)
            error.message = outsideText().clean(error.message, or: "")
            record.lastError = error
        }
        return record
    }
}

extension ProviderConfig {
    /// Why a stored credential may not move from `self` to `new`, or `nil` when it may: the
    /// kind, client and issuer stay, and every origin the new settings would send it to is one
    /// the old settings sent it to already. An issuer is kept whole, not just its origin: its
    /// discovery document, wherever it names, decides where the credential goes.
    func credentialMove(to new: ProviderConfig) -> String? {
        guard kind == new.kind else { return "changes its kind from \(kind) to \(new.kind)" }
        if case .oauth2(let old) = self, case .oauth2(let replacement) = new {
            if old.clientID != replacement.clientID { return "changes its client_id" }
            if old.issuer != replacement.issuer { return "changes its issuer (or switches issuer and token_endpoint)" }
        }
        let known = Set(credentialOrigins)
        if let moved = new.credentialOrigins.first(where: { !known.contains($0) }) {
            let from = known.map(\.description).sorted().joined(separator: ", ")
            return "moves it to \(moved) (its credential was stored for \(from))"
        }
        return nil
    }

    /// The origins this provider sends an account's secrets to.
    private var credentialOrigins: [Origin] {
        let urls: [URL?]
        switch self {
        case .oauth2(let settings): urls = [settings.tokenEndpoint ?? settings.issuer, settings.revocationEndpoint]
        case .sliding(let settings): urls = [settings.endpoint]
        case .refreshURL, .exec, .static: urls = []
        }
        return urls.compactMap { $0.flatMap(Origin.init) }
    }
}

extension AccountRecord {
    /// Whether the record holds a credential an IdP would accept (not just settings).
    var holdsCredential: Bool {
        secrets.refreshToken != nil || secrets.refreshURL != nil || token != nil
    }
}
