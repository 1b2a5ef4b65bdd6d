import FoundationEssentials

/// The protocol version this package speaks.
public let protocolVersion = 1

/// Longest request line the broker accepts, in bytes, without its newline.
public let maximumLineLength = 64 * 1024

/// Every operation of protocol v1.
public enum Operation: String, Sendable, CaseIterable, Codable {
    case hello, token, reject, status, subscribe, add
    case setTokens = "set_tokens"
    case remove, refresh, logout, reload, login
    case lock, unlock, rekey
    case share, unshare, update
    case fleetStatus = "fleet_status"

    /// Operations reserved for the broker's owner (brokerctl).
    public var isOwnerOnly: Bool {
        switch self {
        case .add, .setTokens, .remove, .refresh, .logout, .reload, .login, .lock, .unlock, .rekey, .share, .unshare,
            .update, .fleetStatus:
            return true
        case .hello, .token, .reject, .status, .subscribe: return false
        }
    }
}

/// One request line. Every op-specific field is optional here; the broker checks
/// the ones its op needs. Unknown fields are ignored.
public struct Request: Codable, Sendable {
    public var id: RequestID?
    public var op: String?
    public var account: String?
    /// `subscribe`: the accounts to watch (all when absent).
    public var accounts: [String]?
    public var minTTL: Double?
    public var accessToken: String?
    public var versions: [Int]?
    public var client: String?
    public var provider: ProviderSpec?
    public var tokens: TokenSet?
    /// `logout`: discard the credential even when the IdP cannot be reached to revoke it.
    public var force: Bool?
    /// `login`: the grant, `device` (RFC 8628) or `browser` (authorization code with PKCE).
    public var flow: String?
    /// `login`: the absolute path of a JSON object `{"client_secret": ...}` the broker reads itself.
    public var secretsFile: String?
    /// `login`, browser flow: the loopback port to listen on for the redirect (default: any free one).
    public var redirectPort: Int?
    /// `login`: seconds to wait for the user.
    public var timeout: Double?
    /// `token`: answer with the account's id token instead of its access token.
    public var idToken: Bool?
    /// `unlock`, `rekey`: the passphrase (a secret: never logged, echoed or stored).
    public var passphrase: String?
    /// `rekey`: the key to move the vault to, `passphrase` or `keyfile`.
    public var to: String?
    /// `token`, `reject`: the scopes to narrow the token to, space-separated (RFC 6749 section 6).
    public var scope: String?
    /// `token`, `reject`: the absolute URI of the resource the token is for (RFC 8707).
    public var resource: String?
    /// `add`: create the account in the fleet's shared store, served by every broker of the fleet.
    public var shared: Bool?
    /// `token`: the request a DPoP proof is wanted for, answered beside the token (RFC 9449).
    public var dpop: DPoPRequest?
    /// `update`: the provider fields to change, by their wire names (`null` removes one); a
    /// `client_secret` among them is a secret, stored in the vault and never echoed.
    public var changes: [String: JSONValue]?

    public init(
        id: RequestID?, op: String, account: String? = nil, minTTL: Double? = nil, accessToken: String? = nil,
        versions: [Int]? = nil, client: String? = nil, provider: ProviderSpec? = nil, tokens: TokenSet? = nil,
        force: Bool? = nil, flow: String? = nil, secretsFile: String? = nil, redirectPort: Int? = nil,
        timeout: Double? = nil, idToken: Bool? = nil
    ) {
        self.id = id
        self.op = op
        self.account = account
        self.minTTL = minTTL
        self.accessToken = accessToken
        self.versions = versions
        self.client = client
        self.provider = provider
        self.tokens = tokens
        self.force = force
        self.flow = flow
        self.secretsFile = secretsFile
        self.redirectPort = redirectPort
        self.timeout = timeout
        self.idToken = idToken
    }

    enum CodingKeys: String, CodingKey {
        case id, op, account, accounts, versions, client, provider, tokens, force, flow, timeout, passphrase, to
        case scope, resource, shared, dpop, changes
        case minTTL = "min_ttl"
        case accessToken = "access_token"
        case secretsFile = "secrets_file"
        case redirectPort = "redirect_port"
        case idToken = "id_token"
    }
}

/// The `dpop` object of `status`: the algorithm and the public key's RFC 7638 thumbprint
/// (base64url, the `cnf.jkt` of the tokens bound to it), never anything of the private key;
/// `issued_token_type` when the IdP answered a DPoP request with another type (`Bearer`).
public struct DPoPKeyStatus: Codable, Sendable, Equatable {
    public var algorithm: String
    public var thumbprint: String
    public var issuedTokenType: String?

    public init(algorithm: String, thumbprint: String, issuedTokenType: String? = nil) {
        self.algorithm = algorithm
        self.thumbprint = thumbprint
        self.issuedTokenType = issuedTokenType
    }

    enum CodingKeys: String, CodingKey {
        case algorithm, thumbprint
        case issuedTokenType = "issued_token_type"
    }
}

/// The `dpop` object of a `token` request: the method and URL of the one request the program is
/// about to make with the token, and the resource server's nonce when it gave one.
public struct DPoPRequest: Codable, Sendable, Equatable {
    public var htm: String?
    public var htu: String?
    public var nonce: String?

    public init(htm: String?, htu: String?, nonce: String? = nil) {
        self.htm = htm
        self.htu = htu
        self.nonce = nonce
    }
}

/// How an account obtains new tokens (the `provider` object of `add`, or an `[accounts.NAME]`
/// table of the config file): its kind, and the kind's settings as they were given. The broker's
/// registry of provider kinds reads and checks them; this module does not know the kinds.
public struct ProviderSpec: Codable, Sendable, Equatable {
    public var kind: String
    /// Every other member of the object, by its wire name (`token_endpoint`, `command`, ...).
    /// A `client_secret` among them is a secret: the broker stores it in the vault, never echoes it.
    public var fields: [String: JSONValue]

    public init(kind: String, _ fields: [String: JSONValue] = [:]) {
        self.kind = kind
        self.fields = fields
    }

    /// The field named `name`, as given.
    public subscript(name: String) -> JSONValue? {
        get { fields[name] }
        set { fields[name] = newValue }
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: FieldName.self)
        kind = try container.decode(String.self, forKey: FieldName("kind"))
        fields = [:]
        for key in container.allKeys where key.stringValue != "kind" {
            fields[key.stringValue] = try container.decode(JSONValue.self, forKey: key)
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: FieldName.self)
        try container.encode(kind, forKey: FieldName("kind"))
        for (name, value) in fields where name != "kind" {
            try container.encode(value, forKey: FieldName(name))
        }
    }

    /// A member name of the object.
    private struct FieldName: CodingKey {
        let stringValue: String
        var intValue: Int? { nil }

        init(_ name: String) { stringValue = name }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }
}

/// Tokens pushed into an account (`add`, `set_tokens`). Any field may be absent.
public struct TokenSet: Codable, Sendable, Equatable {
    public var accessToken: String?
    public var tokenType: String?
    public var expiresIn: Double?
    public var expiresAt: Date?
    public var refreshToken: String?
    public var refreshExpiresIn: Double?
    public var refreshExpiresAt: Date?
    public var refreshURL: String?
    public var idToken: String?
    public var scope: String?
    /// `set_tokens`: a new client secret for the account (a secret, stored in the vault).
    public var clientSecret: String?

    public init(
        accessToken: String? = nil, tokenType: String? = nil, expiresIn: Double? = nil, expiresAt: Date? = nil,
        refreshToken: String? = nil, refreshURL: String? = nil, idToken: String? = nil, scope: String? = nil
    ) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresIn = expiresIn
        self.expiresAt = expiresAt
        self.refreshToken = refreshToken
        self.refreshURL = refreshURL
        self.idToken = idToken
        self.scope = scope
    }

    enum CodingKeys: String, CodingKey {
        case scope
        case accessToken = "access_token"
        case tokenType = "token_type"
        case expiresIn = "expires_in"
        case expiresAt = "expires_at"
        case refreshToken = "refresh_token"
        case refreshExpiresIn = "refresh_expires_in"
        case refreshExpiresAt = "refresh_expires_at"
        case refreshURL = "refresh_url"
        case idToken = "id_token"
        case clientSecret = "client_secret"
    }
}

/// The result of `hello`.
public struct HelloResult: Codable, Sendable, Equatable {
    public var `protocol`: Int
    public var server: String
    public var ops: [String]

    public init(protocol: Int, server: String, ops: [String]) {
        self.protocol = `protocol`
        self.server = server
        self.ops = ops
    }
}

/// Token types as RFC 6749 section 5.1 compares them: without regard to case.
public enum TokenType {
    /// Whether `type` is `DPoP` (RFC 9449): a token useless without a proof for each request.
    public static func isDPoP(_ type: String) -> Bool { type.lowercased() == "dpop" }
}

/// The result of `token` and `reject`: an access token valid for at least the requested `min_ttl`.
public struct TokenResult: Codable, Sendable, Equatable {
    public var account: String
    public var accessToken: String
    public var tokenType: String
    public var expiresAt: Date
    public var expiresIn: Int
    public var idToken: String?
    public var scope: String?
    /// The DPoP proof a `token` request with `dpop` asked for.
    public var dpopProof: String?

    public init(
        account: String, accessToken: String, tokenType: String, expiresAt: Date, expiresIn: Int,
        idToken: String? = nil, scope: String? = nil, dpopProof: String? = nil
    ) {
        self.account = account
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresAt = expiresAt
        self.expiresIn = expiresIn
        self.idToken = idToken
        self.scope = scope
        self.dpopProof = dpopProof
    }

    enum CodingKeys: String, CodingKey {
        case account, scope
        case accessToken = "access_token"
        case tokenType = "token_type"
        case dpopProof = "dpop_proof"
        case expiresAt = "expires_at"
        case expiresIn = "expires_in"
        case idToken = "id_token"
    }
}

/// The last error an account's refresh met.
public struct AccountError: Codable, Sendable, Equatable {
    public var code: String
    public var message: String
    public var at: Date

    public init(code: String, message: String, at: Date) {
        self.code = code
        self.message = message
        self.at = at
    }
}

/// One account as `status` reports it; never carries a secret or a token.
public struct AccountStatus: Codable, Sendable, Equatable {
    public var account: String
    public var provider: String
    public var state: String
    public var expiresAt: Date?
    public var refreshExpiresAt: Date?
    public var nextRefreshAt: Date?
    public var lastRefreshAt: Date?
    public var lastError: AccountError?
    /// The git hosts the account serves (`[accounts.NAME.git]`), for `brokerctl git-credential`.
    public var git: GitBridge?
    /// The registries the account serves (`[accounts.NAME.docker]`), for `brokerctl docker-credential`.
    public var docker: DockerBridge?
    /// The scopes the account was configured with (or first granted) that the IdP left out of
    /// its current token, space-separated; absent when none are missing.
    public var lostScope: String?
    /// `true` for an account of the fleet's shared store (docs/fleet.md); absent otherwise.
    public var shared: Bool?
    /// A shared account's row version: it grows with each rotation, the same on every host once
    /// they have read it.
    public var version: Int64?
    /// The fleet host that committed a shared account's row last.
    public var lastRefreshedBy: String?
    /// This broker's fleet host name while it holds the shared account's lease.
    public var leaseHolder: String?
    /// The DPoP key of an account whose tokens are bound to one (RFC 9449); absent otherwise.
    public var dpop: DPoPKeyStatus?
    /// For an account that serves no token (`needs_login`, `logged_out`) or whose refreshes fail
    /// (`stale`, `unavailable`): what brings it back, for people, naming `adviceCommand`.
    public var advice: String?
    /// The brokerctl command of `advice`, which works for this account as it stands.
    public var adviceCommand: String?

    public init(
        account: String, provider: String, state: String, expiresAt: Date? = nil, refreshExpiresAt: Date? = nil,
        nextRefreshAt: Date? = nil, lastRefreshAt: Date? = nil, lastError: AccountError? = nil,
        git: GitBridge? = nil, docker: DockerBridge? = nil, lostScope: String? = nil
    ) {
        self.account = account
        self.provider = provider
        self.state = state
        self.expiresAt = expiresAt
        self.refreshExpiresAt = refreshExpiresAt
        self.nextRefreshAt = nextRefreshAt
        self.lastRefreshAt = lastRefreshAt
        self.lastError = lastError
        self.git = git
        self.docker = docker
        self.lostScope = lostScope
    }

    enum CodingKeys: String, CodingKey {
        case account, provider, state, git, docker, shared, version, dpop, advice
        case adviceCommand = "advice_command"
        case lostScope = "lost_scope"
        case lastRefreshedBy = "last_refreshed_by"
        case leaseHolder = "lease_holder"
        case expiresAt = "expires_at"
        case refreshExpiresAt = "refresh_expires_at"
        case nextRefreshAt = "next_refresh_at"
        case lastRefreshAt = "last_refresh_at"
        case lastError = "last_error"
    }
}

/// The result of `status`.
public struct StatusResult: Codable, Sendable, Equatable {
    public var accounts: [AccountStatus]
    /// `true` while the broker is locked (passphrase mode); absent otherwise.
    public var locked: Bool?
    /// `true` while locked with no vault yet: the first unlock sets the passphrase.
    public var newVault: Bool?
    /// `false` once the broker could not lock a secret in RAM (`RLIMIT_MEMLOCK` reached);
    /// absent while every secret is locked.
    public var memoryLocked: Bool?

    public init(accounts: [AccountStatus], locked: Bool? = nil, newVault: Bool? = nil, memoryLocked: Bool? = nil) {
        self.accounts = accounts
        self.locked = locked
        self.newVault = newVault
        self.memoryLocked = memoryLocked
    }

    enum CodingKeys: String, CodingKey {
        case accounts, locked
        case newVault = "new_vault"
        case memoryLocked = "memory_locked"
    }
}

/// The result of the owner ops that change an account (`add`, `set_tokens`, `remove`, `refresh`).
public struct AccountResult: Codable, Sendable, Equatable {
    public var account: String
    public var state: String

    public init(account: String, state: String) {
        self.account = account
        self.state = state
    }
}

/// The result of `logout`: the account keeps its settings and holds no credential.
public struct LogoutResult: Codable, Sendable, Equatable {
    public var account: String
    public var state: String
    /// Whether the IdP confirmed the revocation (`false`: the provider has no revocation, or
    /// it was skipped with `force`).
    public var revoked: Bool

    public init(account: String, state: String, revoked: Bool) {
        self.account = account
        self.state = state
        self.revoked = revoked
    }
}

/// The result of `reload`: the config file was read and applied.
public struct ReloadResult: Codable, Sendable, Equatable {
    public var reloaded: Bool
    public var accounts: Int

    public init(reloaded: Bool, accounts: Int) {
        self.reloaded = reloaded
        self.accounts = accounts
    }
}
