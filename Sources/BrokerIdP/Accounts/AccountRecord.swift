import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// The current access token of an account; the token and its id token in guarded memory.
public struct AccessToken: Codable, Sendable, Equatable {
    public var value: SecretBytes
    public var type: String
    public var expiresAt: Date
    /// When the broker received it; with `expiresAt` it gives the token's lifetime.
    public var obtainedAt: Date
    public var idToken: SecretBytes?
    public var scope: String?
    /// Pushed by a person (`add`, `set_tokens`) rather than issued to the broker by the IdP,
    /// so its lifetime says nothing about what the IdP grants.
    public var pushed: Bool?
    /// Members of its vault object this release does not know (protocol/VAULT.md).
    package var unknown: UnknownMembers? = nil

    /// Every stored member, as the synthesized initializer (internal to its module) takes them.
    package init(
        value: SecretBytes, type: String, expiresAt: Date, obtainedAt: Date, idToken: SecretBytes? = nil,
        scope: String? = nil, pushed: Bool? = nil, unknown: UnknownMembers? = nil
    ) {
        self.value = value
        self.type = type
        self.expiresAt = expiresAt
        self.obtainedAt = obtainedAt
        self.idToken = idToken
        self.scope = scope
        self.pushed = pushed
        self.unknown = unknown
    }

    package enum CodingKeys: String, CodingKey {
        case value, type, expiresAt, obtainedAt, idToken, scope, pushed
    }

    /// Seconds the token stays valid after `now`.
    public func remaining(at now: Date) -> TimeInterval { expiresAt.timeIntervalSince(now) }
}

/// Refresh credentials and client secrets: only ever in guarded memory and in the vault.
public struct AccountSecrets: Codable, Sendable, Equatable {
    public var refreshToken: SecretBytes?
    /// The refresh credential of `refresh_url` accounts: a one-time URL.
    public var refreshURL: SecretBytes?
    public var refreshExpiresAt: Date?
    public var clientSecret: SecretBytes?
    /// The account's DPoP key (`dpop` set), made by the broker; `nil` for bearer accounts.
    public var dpopKey: DPoPKey? = nil
    /// Members of its vault object this release does not know (protocol/VAULT.md).
    package var unknown: UnknownMembers? = nil

    /// Every stored member, as the synthesized initializer (internal to its module) takes them.
    package init(
        refreshToken: SecretBytes? = nil, refreshURL: SecretBytes? = nil, refreshExpiresAt: Date? = nil,
        clientSecret: SecretBytes? = nil, dpopKey: DPoPKey? = nil, unknown: UnknownMembers? = nil
    ) {
        self.refreshToken = refreshToken
        self.refreshURL = refreshURL
        self.refreshExpiresAt = refreshExpiresAt
        self.clientSecret = clientSecret
        self.dpopKey = dpopKey
        self.unknown = unknown
    }

    package enum CodingKeys: String, CodingKey {
        case refreshToken, refreshURL, refreshExpiresAt, clientSecret, dpopKey
    }
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
    /// The scope of the tokens last pushed or signed in with (before any refresh); `nil` when
    /// they stated none, and in older vaults.
    public var grantedScope: String?
    /// A step of a move to or from the fleet under way, or a refresh the fleet's database has not
    /// taken (`FleetMark`); `nil` for an account of this broker alone.
    public var fleet: FleetMark?
    /// Members of its vault object this release does not know: a later release's fields, which
    /// every rewrite keeps byte for byte (protocol/VAULT.md, "Records of other releases").
    package var unknown: UnknownMembers? = nil
    /// Its `provider` object as the vault held it, when this release would write it otherwise.
    package var providerText: ProviderText? = nil

    /// Every stored member, as the synthesized initializer (internal to its module) takes them.
    package init(
        name: String, provider: ProviderConfig, secrets: AccountSecrets, token: AccessToken? = nil, needsLogin: Bool,
        loggedOut: Bool? = nil, lastError: AccountError? = nil, lastRefreshAt: Date? = nil, declared: Bool? = nil,
        grantedScope: String? = nil, fleet: FleetMark? = nil, unknown: UnknownMembers? = nil,
        providerText: ProviderText? = nil
    ) {
        self.name = name
        self.provider = provider
        self.secrets = secrets
        self.token = token
        self.needsLogin = needsLogin
        self.loggedOut = loggedOut
        self.lastError = lastError
        self.lastRefreshAt = lastRefreshAt
        self.declared = declared
        self.grantedScope = grantedScope
        self.fleet = fleet
        self.unknown = unknown
        self.providerText = providerText
    }

    package enum CodingKeys: String, CodingKey {
        case name, provider, secrets, token, needsLogin, loggedOut, lastError, lastRefreshAt, declared, grantedScope
        case fleet
    }

    /// This record with every date within `Bounds.representableDates` and its last error
    /// cleaned, so a vault written before numbers and texts were checked still loads,
    /// schedules and shows nothing secret.
    package func sanitized() -> AccountRecord {
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

extension AccountRecord {
    /// The scopes the account should hold (its configured `scope`, else the scope it was first
    /// granted) that the IdP left out of the token its last refresh issued, sorted; `nil` when
    /// none are missing or the token states no scope (RFC 6749 section 5.1: as asked).
    package var lostScope: [String]? {
        guard let token, token.pushed != true, let granted = token.scope,
            let expected = (provider.settings as? OAuth2Settings)?.scope ?? grantedScope
        else { return nil }
        let lost = Set(expected.split(separator: " ")).subtracting(granted.split(separator: " "))
        return lost.isEmpty ? nil : lost.map(String.init).sorted()
    }

    /// Gives the record a DPoP key when its settings ask for one (`dpop`) and it has none yet:
    /// when it is created, receives tokens, or signs in. The key then stays until the account
    /// is removed, so a restart or a refresh never changes the thumbprint its tokens are bound to.
    package mutating func makeDPoPKeyIfWanted() throws(BrokerFailure) {
        guard secrets.dpopKey == nil, wantsDPoP else { return }
        secrets.dpopKey = try DPoPKey.generate()
    }

    /// Whether the account's settings bind its tokens to a DPoP key (`dpop`).
    package var wantsDPoP: Bool { (provider.settings as? OAuth2Settings)?.dpop != nil }

    /// The key that signs the account's proofs: its key while its settings ask for DPoP. An
    /// account whose `dpop` was removed keeps its key in the vault (set `dpop` again and its
    /// thumbprint is the same) but sends and makes no proof.
    package var dpopKey: DPoPKey? { wantsDPoP ? secrets.dpopKey : nil }

    /// What signs the account's proofs for programs: its key, with its IdP's endpoints as its
    /// settings and `discovery` name them; `nil` for a bearer account.
    package func dpopSigning(_ discovery: DiscoveryCache) -> (key: DPoPKey, idpEndpoints: DPoPIdPEndpoints)? {
        guard let key = dpopKey, let settings = provider.settings as? OAuth2Settings else { return nil }
        return (key, DPoPIdPEndpoints(settings: settings, discovery: discovery))
    }

    /// Whether the record holds a credential an IdP would accept (not just settings).
    package var holdsCredential: Bool {
        secrets.refreshToken != nil || secrets.refreshURL != nil || token != nil
    }
}
