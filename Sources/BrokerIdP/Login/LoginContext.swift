import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import NIOHTTP1

/// What a login asks of the broker: the grant to run and how long to wait for the user.
public struct LoginOptions: Sendable {
    public var flow: LoginFlow
    /// Browser flow: the loopback port for the redirect (`nil`: any free one).
    public var redirectPort: Int?
    /// Seconds to wait for the user (`nil`: the flow's default).
    public var timeout: TimeInterval?

    /// The default wait of the browser flow.
    public static let defaultTimeout: TimeInterval = 180
    /// The waits a request may ask for.
    public static let timeouts: ClosedRange<TimeInterval> = 1...3600

    public init(flow: LoginFlow, redirectPort: Int? = nil, timeout: TimeInterval? = nil) {
        self.flow = flow
        self.redirectPort = redirectPort
        self.timeout = timeout
    }
}

/// What every login flow works with: the account's settings and client secret, the IdP client,
/// and where progress goes. Its methods are the steps the flows share.
package struct LoginContext: Sendable {
    package let account: AccountName
    package let settings: OAuth2Settings
    package let clientSecret: SecretBytes?
    /// The account's DPoP key, when its tokens are bound to one: the token endpoint gets a
    /// proof of it with every grant, and the authorization request its thumbprint.
    package let dpopKey: DPoPKey?
    package let http: IdPClient
    package let clock: any WallClock
    package let defaultLifetime: TimeInterval
    package let progress: @Sendable (LoginProgress) async -> Void

    /// Every stored member, as the synthesized initializer (internal to its module) takes them.
    package init(
        account: AccountName, settings: OAuth2Settings, clientSecret: SecretBytes?, dpopKey: DPoPKey?, http: IdPClient,
        clock: any WallClock, defaultLifetime: TimeInterval,
        progress: @escaping @Sendable (LoginProgress) async -> Void,
        accountExists: Bool = false, accountDeclared: Bool = false
    ) {
        self.accountExists = accountExists
        self.accountDeclared = accountDeclared
        self.account = account
        self.settings = settings
        self.clientSecret = clientSecret
        self.dpopKey = dpopKey
        self.http = http
        self.clock = clock
        self.defaultLifetime = defaultLifetime
        self.progress = progress
    }
    /// Whether the account exists (a login restores it) rather than being created by the login.
    package var accountExists = false
    /// Whether broker.toml declares the account (and so holds its client settings).
    package var accountDeclared = false

    /// The refusal of a login whose `flow` the IdP offers no endpoint for (its discovery document,
    /// if any, just read), naming what can work instead: the other flow, or for an account that
    /// exists, a push of its refresh token or an endpoint added with `update`.
    package func noEndpoint(for flow: LoginFlow, accountExists: Bool) -> BrokerFailure {
        let missing = flow == .device ? "device authorization endpoint" : "authorization endpoint"
        let restore = settings.restoration(discovered: settings.issuer.flatMap(http.discovery.known))
        let instead: String
        switch restore {
        case .signIn(let other?) where other != flow: instead = restore.sentence(for: account.rawValue)
        case _ where accountExists: instead = restore.sentence(for: account.rawValue)
        default:
            instead =
                "give --authorization-endpoint or --device-authorization-endpoint, or add the account with its refresh "
                + "token (brokerctl add \(account) --kind oauth2 ... --secrets -)"
        }
        return .invalid("the IdP offers no \(missing) (--flow \(flow.rawValue)); \(instead)")
    }

    /// Text from the IdP made fit for a line: bounded, printable, the client secret redacted.
    package func clean(_ text: String) -> String {
        OutsideText(secrets: [clientSecret?.text]).clean(text, or: "?")
    }

    /// The endpoint `configured`, else the one the issuer's discovery document names
    /// (`discovered`), read afresh; `nil` when neither gives one.
    package func endpoint(_ configured: URL?, discovered: KeyPath<DiscoveredEndpoints, URL?>)
        async throws(BrokerFailure)
        -> URL?
    {
        if let configured { return configured }
        guard let issuer = settings.issuer else { return nil }
        switch await http.discovery.endpoints(issuer: issuer, http: http, fresh: true) {
        case .success(let endpoints): return endpoints[keyPath: discovered]
        case .failure(let failure): throw .loginUnavailable(reason: clean(failure.message))
        }
    }

    /// POSTs `form` with the client's authentication to `url`; with `proving`, with a DPoP
    /// proof of the account's key (the token endpoint's requests).
    package func post(_ form: [(String, String)], to url: URL, proving: Bool = false) async -> Result<
        IdPReply, RefreshFailure
    > {
        var form = form
        let headers = settings.authenticate(&form, secret: clientSecret?.text)
        let clock = self.clock
        let proof = proving ? dpopKey.map { (key: $0, at: { @Sendable in clock.now() }) } : nil
        return await http.post(url, headers: headers, body: FormEncoding.encode(form), proof: proof)
    }

    /// Sends a grant to the token endpoint and reads the tokens it answers with; `refusal`
    /// names the grant in the message of a refused one ("the code exchange").
    package func exchange(_ form: [(String, String)], refusal: String) async throws(BrokerFailure) -> Grant {
        let reply = try await tokenEndpointReply(form)
        return try grant(from: reply, refusal: refusal)
    }

    /// The token endpoint's answer to a grant, or `unavailable` when it cannot be reached.
    package func tokenEndpointReply(_ form: [(String, String)]) async throws(BrokerFailure) -> IdPReply {
        let endpoint: URL
        switch await settings.tokenEndpoint(http: http) {
        case .success(let url): endpoint = url
        case .failure(let failure): throw .loginUnavailable(reason: clean(failure.message))
        }
        switch await post(form, to: endpoint, proving: true) {
        case .success(let reply): return reply
        case .failure(let failure): throw .loginUnavailable(reason: clean(failure.message))
        }
    }

    /// The tokens of a token endpoint's answer (RFC 6749 section 5); a refusal (a denial of
    /// `OAuth2Provider.interpret`) ends the login (`needs_login`; `clientRejected` for the
    /// client's own errors), anything else is `unavailable`.
    package func grant(from reply: IdPReply, refusal: String) throws(BrokerFailure) -> Grant {
        switch OAuth2Provider.interpret(reply, now: clock.now(), defaultLifetime: defaultLifetime) {
        case .success(let grant):
            return grant
        case .failure(let failure) where failure.kind == .denial:
            throw refused(refusal, reply)
        case .failure(let failure):
            throw .loginUnavailable(reason: clean(failure.message))
        }
    }

    /// The failure of a request (`what`: "the code exchange") the IdP refused with `reply`:
    /// `clientRejected` when it refused the client itself, whose settings are at fault (signing
    /// in again cannot help), else `loginFailed`.
    package func refused(_ what: String, _ reply: IdPReply) -> BrokerFailure {
        let error = OAuthError(reply)
        let reason = "the IdP refused \(what): HTTP \(reply.status)\(quoted(error))"
        return error?.rejectsClient == true
            ? .clientRejected(account, reason: reason, declared: accountDeclared)
            : .loginFailed(account, reason: reason)
    }

    /// ` (error: description)` of an IdP's error, cleaned; empty without one.
    package func quoted(_ error: OAuthError?) -> String {
        error.map { " (\(clean($0.text)))" } ?? ""
    }

    /// Sleeps until `deadline`; a cancelled login ends here.
    package func sleep(until deadline: LoginDeadline) async throws(BrokerFailure) {
        guard await deadline.reached() else { throw cancelled }
    }

    /// The failure of a login whose client went away.
    package var cancelled: BrokerFailure { .loginFailed(account, reason: "the login was cancelled") }
}
