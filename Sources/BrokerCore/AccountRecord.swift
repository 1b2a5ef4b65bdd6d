import BrokerProtocol
import Foundation

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
}
