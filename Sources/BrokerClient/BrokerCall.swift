import BrokerProtocol
import FoundationEssentials

/// A request and the type its answer's `result` decodes to: what both clients send
/// (`BrokerClient` over its shared connection, `BlockingBrokerClient` on the calling thread).
public struct BrokerCall<Result: Decodable & Sendable>: Sendable {
    /// The request; its `id` is assigned by the client that sends it.
    public var request: Request

    public init(_ request: Request) { self.request = request }

    /// The request line for `id`, newline included.
    func line(id: RequestID) throws -> Data {
        if let line = FlatRequest.line(of: request, id: id) { return Data(line) }
        var request = request
        request.id = id
        var data = try Wire.makeEncoder().encode(request)
        data.append(0x0A)
        return data
    }

    /// The result an answer line carries; a failure line is thrown as its `BrokerError`.
    static func result(of line: Data) throws -> Result {
        let decoder = Wire.makeDecoder()
        let head = try decoder.decode(ResponseHead.self, from: line)
        if head.ok != true {
            throw head.error?.brokerError ?? BrokerError(.internal, "the broker sent a failure without an error")
        }
        return try decoder.decode(ResultBody<Result>.self, from: line).result
    }
}

extension BrokerCall where Result == TokenResult {
    /// An access token valid for at least `minTTL` seconds (the broker refreshes if needed),
    /// narrowed to `scope` (space-separated) and bound to `resource` (an absolute URI) when
    /// given: `oauth2` accounts only; the result's `scope` is what the IdP granted.
    public static func token(
        account: String, minTTL: TimeInterval? = nil, scope: String? = nil, resource: String? = nil,
        dpop: DPoPRequest? = nil
    ) -> Self {
        var request = Request(id: nil, op: "token", account: account, minTTL: minTTL)
        (request.scope, request.resource, request.dpop) = (scope, resource, dpop)
        return Self(request)
    }

    /// Reports that a resource server refused `accessToken` (got with `scope` and `resource`);
    /// answers the token to use instead.
    public static func reject(
        account: String, accessToken: String, minTTL: TimeInterval? = nil, scope: String? = nil,
        resource: String? = nil
    ) -> Self {
        var request = Request(id: nil, op: "reject", account: account, minTTL: minTTL, accessToken: accessToken)
        (request.scope, request.resource) = (scope, resource)
        return Self(request)
    }
}

extension BrokerCall where Result == IDTokenResult {
    /// The account's OpenID Connect id token (`token` with `id_token`); `not_found` when the
    /// IdP issued none.
    public static func idToken(account: String, minTTL: TimeInterval? = nil) -> Self {
        Self(Request(id: nil, op: "token", account: account, minTTL: minTTL, idToken: true))
    }
}

extension BrokerCall where Result == LoginResult {
    /// Signs `account` in at its IdP with `flow` (owner only): the broker runs the grant and
    /// stores the tokens, creating the account (from `provider`) or restoring it in place. The
    /// broker answers with `LoginProgress` lines before the result: send it with
    /// `BlockingBrokerClient.perform(_:idleInterval:idle:progress:)`. `secretsFile` is the
    /// absolute path of `{"client_secret": ...}` for the broker to read; `timeout` the seconds
    /// the user has.
    public static func login(
        account: String, flow: LoginFlow, provider: ProviderSpec? = nil, secretsFile: String? = nil,
        redirectPort: Int? = nil, timeout: Double? = nil
    ) -> Self {
        Self(
            Request(
                id: nil, op: "login", account: account, provider: provider, flow: flow.rawValue,
                secretsFile: secretsFile, redirectPort: redirectPort, timeout: timeout))
    }
}

extension BrokerCall where Result == HelloResult {
    /// The broker's protocol version, name and operations.
    public static func hello(client: String? = nil) -> Self {
        Self(Request(id: nil, op: "hello", versions: [protocolVersion], client: client))
    }
}

extension BrokerCall where Result == FleetStatusResult {
    /// The fleet's database as the broker sees it: reachable or why not, the hosts seen, the
    /// leases held (owner only).
    public static var fleetStatus: Self { Self(Request(id: nil, op: "fleet_status")) }
}

extension BrokerCall where Result == StatusResult {
    /// The state of one account, or of all visible accounts.
    public static func status(account: String? = nil) -> Self {
        Self(Request(id: nil, op: "status", account: account))
    }
}

extension BrokerCall where Result == AccountResult {
    /// Creates an account (owner only).
    public static func add(account: String, provider: ProviderSpec, tokens: TokenSet? = nil, shared: Bool = false)
        -> Self
    {
        var request = Request(id: nil, op: "add", account: account, provider: provider, tokens: tokens)
        request.shared = shared ? true : nil
        return Self(request)
    }

    /// Pushes new tokens into an account (owner only); clears `needs_login`.
    public static func setTokens(account: String, tokens: TokenSet) -> Self {
        Self(Request(id: nil, op: "set_tokens", account: account, tokens: tokens))
    }

    /// Changes an account's provider settings and client secret in place (owner only);
    /// `changes` holds provider fields by wire name (`null` removes one) and `client_secret`.
    public static func update(account: String, changes: [String: JSONValue]) -> Self {
        var request = Request(id: nil, op: "update", account: account)
        request.changes = changes
        return Self(request)
    }

    /// Deletes an account and its secrets (owner only).
    public static func remove(account: String) -> Self {
        Self(Request(id: nil, op: "remove", account: account))
    }

    /// Moves a local account into the fleet's shared store (owner only).
    public static func share(account: String) -> Self {
        Self(Request(id: nil, op: "share", account: account))
    }

    /// Moves a shared account out of the fleet's store into this broker's vault (owner only).
    public static func unshare(account: String) -> Self {
        Self(Request(id: nil, op: "unshare", account: account))
    }

    /// Refreshes an account now (owner only).
    public static func refresh(account: String) -> Self {
        Self(Request(id: nil, op: "refresh", account: account))
    }
}

extension BrokerCall where Result == LogoutResult {
    /// Revokes an account's credential where the IdP can, then discards its tokens (owner
    /// only); `force` discards them even when the IdP cannot be reached.
    public static func logout(account: String, force: Bool = false) -> Self {
        Self(Request(id: nil, op: "logout", account: account, force: force ? true : nil))
    }
}

extension BrokerCall where Result == ReloadResult {
    /// Makes the broker re-read its config file (owner only).
    public static func reload() -> Self { Self(Request(id: nil, op: "reload")) }
}

extension BrokerCall where Result == SubscribeResult {
    /// Events of `accounts` (all when `nil`) on this connection, after the acknowledgement.
    public static func subscribe(accounts: [String]? = nil) -> Self {
        var request = Request(id: nil, op: "subscribe")
        request.accounts = accounts
        return Self(request)
    }
}
