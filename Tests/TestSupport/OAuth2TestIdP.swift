import BrokerProtocol
import Foundation
import NIOHTTP1

/// A real OAuth2 token endpoint for tests, on 127.0.0.1 or in process (`TestIdPServing`). It behaves like production IdPs:
/// every refresh rotates the refresh token, and a reused (or unknown) refresh token is
/// answered with `400 invalid_grant`. Faults can be switched on to imitate outages (they
/// apply to the revocation endpoint too). It also serves an RFC 7009 revocation endpoint and
/// an OIDC discovery document for `issuer` that names both endpoints, and the endpoints of
/// `brokerctl login` (see `OAuth2TestIdP+Login.swift`): a device authorization endpoint
/// (RFC 8628) and an authorization endpoint with PKCE (RFC 7636) and loopback redirects
/// (RFC 8252), whose codes the token endpoint exchanges; grants asked with scope `openid`
/// carry an id token. With `setOriginalGrant`, it holds a refresh's `scope` to the scopes of
/// the original grant (RFC 6749 section 6: `invalid_scope` otherwise), states the granted scope
/// in every answer, and, with `setResources`, refuses other resources (RFC 8707 `invalid_target`).
/// With `requireDPoP`, it is a DPoP authorization server (RFC 9449, `OAuth2TestIdP+DPoP.swift`).
public final class OAuth2TestIdP: Sendable {
    /// How the endpoint answers the next requests.
    public enum Behavior: Sendable, Equatable {
        case normal
        /// Answer with this HTTP status and a JSON error body (and `Retry-After` if given).
        case status(Int, retryAfter: Int?)
        /// Answer with this HTTP status and an OAuth error body (RFC 6749 section 5.2) of this
        /// `error` and, when given, `error_description`.
        case oauthError(Int, error: String, description: String?)
        /// Answer 200 with a body that is not JSON.
        case garbage
        /// Accept the request and never answer.
        case hang
    }

    /// One request the endpoint received.
    public struct Call: Sendable, Equatable {
        public var grantType: String?
        public var refreshToken: String?
        public var clientID: String?
        public var clientSecret: String?
        public var at: Date
        /// The `scope` parameter, as sent.
        public var scope: String? = nil
        /// The `resource` parameter (RFC 8707), as sent.
        public var resource: String? = nil
        /// The `code` of an authorization-code grant, as sent.
        public var code: String? = nil
        /// Whether the refresh token presented was the current one (a refresh that reused a
        /// dead one is refused).
        public var presentedCurrent = false
    }

    struct State {
        var currentRefreshToken: String
        var serial = 0
        var issuedAccessTokens: [String] = []
        var issuedRefreshTokens: [String] = []
        var calls: [Call] = []
        var rejectedReuse = 0
        var behavior = Behavior.normal
        var lifetime: Int
        var delay: Duration = .zero
        /// Holds the revocation endpoint's answers while set.
        var revocationGate: AnswerGate?
        /// Holds the token endpoint's answers while set.
        var tokenGate: AnswerGate?
        var discoveryBehavior = Behavior.normal
        var discoveryCount = 0
        var revocations: [Revocation] = []
        var login = LoginState()
        /// The scopes of the original grant; `nil`: scopes are not checked or stated.
        var originalGrant: Set<String>?
        /// The resources a refresh may name; `nil`: any.
        var resources: Set<String>?
        /// Whether a refresh with a narrower scope narrows the grant itself (django-oauth-toolkit).
        var narrowsChain = false
        /// Issue tokens with 40 random hex digits, long enough that finding one in a memory
        /// scan cannot be a coincidence.
        var longTokens = false
        /// Characters added to every access token issued, so a test can make records large.
        var accessTokenPadding = 0
        /// Whether a new grant revokes every access token issued before it (django-oauth-toolkit
        /// does when it rotates the refresh token).
        var revokesOnRotation = false
        /// When each access token was issued, until when it lives, and when a rotation revoked it.
        var accessTokenTimes: [String: (issued: Date, expires: Date, revoked: Date?)] = [:]
        /// DPoP mode (`OAuth2TestIdP+DPoP.swift`), off by default.
        var dpop = DPoPState()
    }

    /// One request the revocation endpoint received.
    public struct Revocation: Sendable, Equatable {
        public var token: String?
        public var hint: String?
        public var clientID: String?
    }

    /// Where the issuer lives under the server's root (an issuer with a path, like Keycloak's realms).
    static let issuerPath = "/realms/test"

    public let clientID: String
    public let clientSecret: String
    let state: Box<State>
    private let server: any TestIdPHost

    /// The token endpoint's URL.
    public var tokenEndpoint: String { server.baseURL + "/token" }
    /// The revocation endpoint's URL (RFC 7009).
    public var revocationEndpoint: String { server.baseURL + "/revoke" }

    /// The OIDC issuer whose discovery document (`{issuer}/.well-known/openid-configuration`)
    /// names `tokenEndpoint`.
    public var issuer: String { server.baseURL + Self.issuerPath }

    /// An `oauth2` provider object for this IdP: its token endpoint, client id and secret, and
    /// `clientAuth` when given (else the broker's default, client_secret_basic).
    public func provider(clientAuth: String? = nil) -> ProviderSpec {
        var provider = ProviderSpec(
            kind: "oauth2",
            [
                "token_endpoint": .string(tokenEndpoint), "client_id": .string(clientID),
                "client_secret": .string(clientSecret),
            ])
        if let clientAuth { provider["client_auth"] = .string(clientAuth) }
        return provider
    }

    /// Starts serving (`serving`); `initialRefreshToken` is the one valid refresh token at first.
    public init(
        initialRefreshToken: String = "rt-0", lifetime: Int = 3600, clientID: String = "test-client",
        clientSecret: String = "test-client-secret-\(UInt32.random(in: 0...UInt32.max))",
        serving: TestIdPServing = .http
    ) async throws {
        self.clientID = clientID
        self.clientSecret = clientSecret
        let state = Box(State(currentRefreshToken: initialRefreshToken, lifetime: lifetime))
        self.state = state
        let secret = clientSecret
        let issuerPath = Self.issuerPath
        server = try await serving.start { request in
            if request.method == .GET, request.path == issuerPath + "/.well-known/openid-configuration" {
                return Self.discovery(request, state: state, issuerPath: issuerPath)
            }
            if let answer = Self.loginEndpoint(request, state: state, clientID: clientID, clientSecret: secret) {
                return answer
            }
            let client = Self.client(FormBody.parse(request.body), authorization: request.header("Authorization"))
            if request.path == "/revoke" {
                return Self.revoke(
                    FormBody.parse(request.body), client: client, state: state, clientID: clientID, clientSecret: secret
                )
            }
            var answer = Self.answer(
                FormBody.parse(request.body), client: client, state: state, clientID: clientID, clientSecret: secret,
                dpop: DPoPRequest(request))
            state.withLock { state in
                answer.gate = state.tokenGate
                answer.headers += state.dpop.nonceHeaders
            }
            return answer
        }
    }

    /// Stops listening.
    public func shutdown() async {
        await server.shutdown()
    }

    // MARK: Controls and observations

    public func setBehavior(_ behavior: Behavior) { state.withLock { $0.behavior = behavior } }
    public func setLifetime(_ seconds: Int) { state.withLock { $0.lifetime = seconds } }
    public func setDelay(_ delay: Duration) { state.withLock { $0.delay = delay } }
    /// Holds every later answer of the token endpoint until the gate returned is opened.
    public func holdAnswers() -> AnswerGate {
        let gate = AnswerGate()
        state.withLock { $0.tokenGate = gate }
        return gate
    }
    /// Holds every later answer of the revocation endpoint until the gate returned is opened.
    public func holdRevocations() -> AnswerGate {
        let gate = AnswerGate()
        state.withLock { $0.revocationGate = gate }
        return gate
    }
    /// Holds refreshes to the scopes of `scope` (space-separated) and states the granted scope.
    public func setOriginalGrant(scope: String) {
        state.withLock { $0.originalGrant = Set(scope.split(separator: " ").map(String.init)) }
    }
    /// Makes a refresh with a narrower scope narrow the grant for every later refresh too, as
    /// django-oauth-toolkit does (RFC 6749 section 6 keeps the original grant).
    public func setNarrowsChain(_ narrows: Bool) { state.withLock { $0.narrowsChain = narrows } }
    /// Refuses a refresh naming a resource not in `resources` with `invalid_target`.
    public func setResources(_ resources: Set<String>) { state.withLock { $0.resources = resources } }
    /// The refresh-token grants received, in order.
    public var refreshCalls: [Call] { state.withLock { $0.calls.filter { $0.grantType == "refresh_token" } } }
    /// From now on, each new grant revokes the access tokens issued before it, as
    /// django-oauth-toolkit does when it rotates the refresh token.
    public func revokeOnRotation() { state.withLock { $0.revokesOnRotation = true } }
    /// Whether a resource server asking this IdP would have accepted `token` at `date`: issued
    /// by it, not expired and not revoked by a rotation, allowing `grace` seconds at both ends.
    public func accepted(_ token: String, at date: Date, grace: TimeInterval) -> Bool {
        guard let times = state.withLock({ $0.accessTokenTimes[token] }) else { return false }
        let end = min(times.expires, times.revoked ?? .distantFuture)
        return date >= times.issued.addingTimeInterval(-grace) && date < end.addingTimeInterval(grace)
    }
    /// From now on, tokens carry 40 random hex digits instead of a short number.
    public func issueLongTokens() { state.withLock { $0.longTokens = true } }
    /// From now on, access tokens are `count` characters longer.
    public func padAccessTokens(by count: Int) { state.withLock { $0.accessTokenPadding = count } }
    /// The one refresh token the IdP accepts now.
    public var currentRefreshToken: String { state.withLock { $0.currentRefreshToken } }
    /// Makes `refreshToken` the one valid refresh token, as if the user had logged in elsewhere.
    public func acceptRefreshToken(_ refreshToken: String) {
        state.withLock { $0.currentRefreshToken = refreshToken }
    }

    public var calls: [Call] { state.withLock { $0.calls } }
    public var callCount: Int { state.withLock { $0.calls.count } }
    public var issuedAccessTokens: [String] { state.withLock { $0.issuedAccessTokens } }
    public var issuedRefreshTokens: [String] { state.withLock { $0.issuedRefreshTokens } }
    /// Requests the revocation endpoint received.
    public var revocations: [Revocation] { state.withLock { $0.revocations } }
    /// How many requests presented a refresh token that was not the current one.
    public var rejectedReuse: Int { state.withLock { $0.rejectedReuse } }

    /// How the discovery document is served (`status` and `garbage` imitate a broken issuer).
    public func setDiscoveryBehavior(_ behavior: Behavior) { state.withLock { $0.discoveryBehavior = behavior } }
    /// How many times the discovery document was fetched.
    public var discoveryCount: Int { state.withLock { $0.discoveryCount } }

    typealias Answer = TestHTTPResponse

    fileprivate static func discovery(_ request: TestHTTPRequest, state: Box<State>, issuerPath: String) -> Answer {
        let base = "http://" + (request.header("Host") ?? "127.0.0.1")
        return state.withLock { state in
            state.discoveryCount += 1
            if let fault = state.discoveryBehavior.response(errorBody: #"{"error":"unavailable"}"#) { return fault }
            let device =
                state.login.offersDeviceEndpoint
                ? #""device_authorization_endpoint":"\#(base)/device/code","# : ""
            let authorization =
                state.login.offersAuthorizationEndpoint ? #""authorization_endpoint":"\#(base)/authorize","# : ""
            // RFC 9449 section 5.1.
            let dpop = state.dpop.required ? #","dpop_signing_alg_values_supported":["ES256"]"# : ""
            let body = """
                {"issuer":"\(base + issuerPath)","token_endpoint":"\(base)/token","revocation_endpoint":"\(base)/revoke",\
                \(authorization)\(device)\
                "grant_types_supported":["refresh_token","authorization_code"]\(dpop)}
                """
            return Answer(status: .ok, body: body)
        }
    }

    /// The client id and secret a request presents, in the form or as HTTP Basic.
    static func client(_ form: [String: String], authorization: String?) -> (id: String?, secret: String?) {
        if let authorization, authorization.hasPrefix("Basic "),
            let decoded = Data(base64Encoded: String(authorization.dropFirst(6))).map({
                String(decoding: $0, as: UTF8.self)
            }),
            let colon = decoded.firstIndex(of: ":")
        {
            return (
                String(decoded[..<colon]).removingPercentEncoding,
                String(decoded[decoded.index(after: colon)...]).removingPercentEncoding
            )
        }
        return (form["client_id"], form["client_secret"])
    }

    /// RFC 7009: revoking the current refresh token kills it; an unknown token is answered 200 too.
    fileprivate static func revoke(
        _ form: [String: String], client: (id: String?, secret: String?), state: Box<State>, clientID: String,
        clientSecret: String
    ) -> Answer {
        state.withLock { state in
            state.revocations.append(
                Revocation(token: form["token"], hint: form["token_type_hint"], clientID: client.id))
            if let fault = state.behavior.response(errorBody: #"{"error":"temporarily_unavailable"}"#) { return fault }
            guard client.id == clientID, client.secret == nil || client.secret == clientSecret else {
                return Answer(status: .unauthorized, body: #"{"error":"invalid_client"}"#)
            }
            guard let token = form["token"] else {
                return Answer(status: .badRequest, body: #"{"error":"invalid_request"}"#)
            }
            if token == state.currentRefreshToken { state.currentRefreshToken = "revoked-\(randomSuffix())" }
            return Answer(status: .ok, body: "", delay: state.delay, gate: state.revocationGate)
        }
    }

    fileprivate static func answer(
        _ form: [String: String], client: (id: String?, secret: String?), state: Box<State>, clientID: String,
        clientSecret: String, dpop: DPoPRequest
    ) -> Answer {
        let presentedID = client.id
        let presentedSecret = client.secret
        return state.withLock { state in
            state.calls.append(
                Call(
                    grantType: form["grant_type"], refreshToken: form["refresh_token"], clientID: presentedID,
                    clientSecret: presentedSecret, at: Date(), scope: form["scope"], resource: form["resource"],
                    code: form["code"], presentedCurrent: form["refresh_token"] == state.currentRefreshToken))
            let delay = state.delay
            switch state.behavior {
            case .hang:
                return .hanging
            case .garbage:
                return Answer(status: .ok, body: "<html>this is not json", delay: delay)
            case .status(let code, let retryAfter):
                return Answer(
                    status: HTTPResponseStatus(statusCode: code), body: #"{"error":"temporarily_unavailable"}"#,
                    headers: retryAfter.map { [("Retry-After", String($0))] } ?? [], delay: delay)
            case .oauthError:
                guard var fault = state.behavior.response(errorBody: "") else { break }
                fault.delay = delay
                return fault
            case .normal:
                break
            }
            guard presentedID == clientID, presentedSecret == nil || presentedSecret == clientSecret else {
                return Answer(status: .unauthorized, body: #"{"error":"invalid_client"}"#, delay: delay)
            }
            if let refusal = dpopRefusal(dpop, publicClient: presentedSecret == nil, state: &state, delay: delay) {
                return refusal
            }
            switch form["grant_type"] {
            case "refresh_token": break
            case Self.deviceGrantType: return deviceGrant(form, state: &state, clientID: clientID, delay: delay)
            case "authorization_code": return codeGrant(form, state: &state, clientID: clientID, delay: delay)
            default: return Answer(status: .badRequest, body: #"{"error":"unsupported_grant_type"}"#, delay: delay)
            }
            guard form["refresh_token"] == state.currentRefreshToken else {
                state.rejectedReuse += 1
                return Answer(
                    status: .badRequest,
                    body: #"{"error":"invalid_grant","error_description":"refresh token is not valid"}"#, delay: delay)
            }
            guard state.dpop.allows(boundTo: state.dpop.refreshBindings[state.currentRefreshToken]) else {
                return Answer(
                    status: .badRequest,
                    body: #"{"error":"invalid_grant","error_description":"refresh token bound to another DPoP key"}"#,
                    delay: delay)
            }
            if let refusal = refusal(of: form, state: state) {
                return Answer(status: .badRequest, body: refusal, delay: delay)
            }
            let scope = form["scope"] ?? state.login.grantedScope
            let granted = state.originalGrant.map { original in
                form["scope"].map { Set($0.split(separator: " ").map(String.init)) } ?? original
            }
            if state.narrowsChain, let granted { state.originalGrant = granted }
            return Answer(
                status: .ok,
                body: issue(
                    &state, idToken: state.login.idTokensOnRefresh && hasOpenID(scope), clientID: clientID,
                    scope: granted.map { $0.sorted().joined(separator: " ") }),
                delay: delay)
        }
    }

    /// The error body refusing a refresh's scope beyond the original grant (`invalid_scope`) or
    /// a resource not served (`invalid_target`); `nil` when neither applies.
    static func refusal(of form: [String: String], state: State) -> String? {
        if let original = state.originalGrant, let asked = form["scope"],
            let extra = Set(asked.split(separator: " ").map(String.init)).subtracting(original).sorted().first
        {
            return #"{"error":"invalid_scope","error_description":"scope \#(extra) was not granted"}"#
        }
        if let resources = state.resources, let resource = form["resource"], !resources.contains(resource) {
            return #"{"error":"invalid_target","error_description":"no such resource here"}"#
        }
        return nil
    }

    /// A token answer with a new access token and a rotated refresh token (the old one dies),
    /// and an id token when `idToken`.
    static func issue(_ state: inout State, idToken: Bool, clientID: String, scope: String? = nil) -> String {
        state.serial += 1
        let long = state.longTokens
        let suffix = { long ? longRandomHex() : String(UInt32.random(in: 0...UInt32.max)) }
        let access = "at-\(state.serial)-\(suffix())" + String(repeating: "p", count: state.accessTokenPadding)
        let refresh = "rt-\(state.serial)-\(suffix())"
        state.currentRefreshToken = refresh
        let now = Date()
        if state.revokesOnRotation {
            for (token, times) in state.accessTokenTimes where times.revoked == nil {
                state.accessTokenTimes[token]?.revoked = now
            }
        }
        state.accessTokenTimes[access] = (now, now.addingTimeInterval(Double(state.lifetime)), nil)
        state.issuedAccessTokens.append(access)
        state.issuedRefreshTokens.append(refresh)
        state.dpop.bind(access: access, refresh: refresh)
        var body =
            #"{"access_token":"\#(access)","token_type":"\#(state.dpop.tokenType)","expires_in":\#(state.lifetime),"refresh_token":"\#(refresh)""#
        if idToken {
            let token = makeIDToken(&state, clientID: clientID)
            body += #","id_token":"\#(token)""#
        }
        if let scope { body += #","scope":"\#(scope)""# }
        return body + "}"
    }
}

/// 40 random hex digits.
public func longRandomHex() -> String {
    String((0..<3).map { _ in String(UInt64.random(in: 1 << 60...UInt64.max), radix: 16) }.joined().prefix(40))
}
