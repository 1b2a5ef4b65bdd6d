import CSodium
import Foundation
import NIOHTTP1

/// The login side of the test IdP, behaving as real IdPs do: the device authorization grant
/// (RFC 8628) and the authorization code grant with PKCE S256 (RFC 7636) and loopback redirects
/// (RFC 8252 section 7.3). The test plays the user through `TestBrowser`.
extension OAuth2TestIdP {
    /// What the user does at the authorization endpoint.
    public enum Decision: Sendable, Equatable {
        case approve, deny
    }

    /// One pending device authorization.
    struct DeviceAuthorization {
        var deviceCode: String
        var userCode: String
        var scope: String?
        var expiresAt: Date
        var decision: Decision?
        var used = false
        /// The interval this device code must be polled at; `slow_down` adds 5 s (RFC 8628 3.5).
        var interval: Int
        var lastPoll: Date?
    }

    /// One code the authorization endpoint issued.
    struct IssuedCode {
        var clientID: String
        var redirectURI: String
        var challenge: String
        var scope: String?
        var used = false
        /// The `dpop_jkt` of its authorization request (RFC 9449 section 10).
        var dpopJKT: String? = nil
    }

    /// Everything the login endpoints keep.
    struct LoginState {
        var offersDeviceEndpoint = true
        /// Whether the discovery document names the authorization endpoint.
        var offersAuthorizationEndpoint = true
        var idTokensOnRefresh = true
        /// The `exp` of the next id tokens; `nil`: an hour from now.
        var idTokenExpiry: Date?
        var deviceInterval = 5
        var deviceExpiresIn = 600
        var devices: [DeviceAuthorization] = []
        var forcedSlowDowns = 0
        var decision = Decision.approve
        var codes: [String: IssuedCode] = [:]
        var grantedScope: String?
        var issuedIDTokens: [String] = []
        var devicePolls: [Date] = []
        /// The clock device codes are judged by (their expiry, the pace of polls).
        var deviceClock: @Sendable () -> Date = { Date() }
        var authorizationRequests = 0
        var rejectedCodeExchanges: [String] = []
    }

    static let deviceGrantType = "urn:ietf:params:oauth:grant-type:device_code"

    // MARK: Controls and observations

    /// The device authorization endpoint's URL (RFC 8628 section 3.1).
    public var deviceAuthorizationEndpoint: String { tokenEndpoint.replacing("/token", with: "/device/code") }
    /// The authorization endpoint's URL.
    public var authorizationEndpoint: String { tokenEndpoint.replacing("/token", with: "/authorize") }

    /// Whether discovery names the device authorization endpoint (and the endpoint answers).
    public func setOffersDeviceEndpoint(_ offers: Bool) { state.withLock { $0.login.offersDeviceEndpoint = offers } }

    /// Whether the discovery document names the authorization endpoint (it still answers).
    public func setOffersAuthorizationEndpoint(_ offers: Bool) {
        state.withLock { $0.login.offersAuthorizationEndpoint = offers }
    }
    /// Whether refresh answers carry an id token (some IdPs send one only at login).
    public func setIDTokensOnRefresh(_ sends: Bool) { state.withLock { $0.login.idTokensOnRefresh = sends } }
    /// The `exp` of the id tokens issued from now on.
    public func setIDTokenExpiry(_ date: Date?) { state.withLock { $0.login.idTokenExpiry = date } }
    /// The `interval` and `expires_in` of the next device authorizations.
    public func setDeviceTiming(interval: Int, expiresIn: Int = 600) {
        state.withLock {
            $0.login.deviceInterval = interval
            $0.login.deviceExpiresIn = expiresIn
        }
    }
    /// Judges device codes (their expiry, the pace of polls) by `clock`, the one the broker under
    /// test polls on.
    public func judgeDevices(on clock: TestClock) {
        state.withLock { $0.login.deviceClock = { clock.now() } }
    }
    /// Answers the next `count` device polls `slow_down`, however slowly they come.
    public func forceSlowDown(_ count: Int = 1) { state.withLock { $0.login.forcedSlowDowns += count } }
    /// Makes every pending device code expired (the next poll gets `expired_token`).
    public func expireDeviceCodes() {
        state.withLock { state in
            for index in state.login.devices.indices { state.login.devices[index].expiresAt = .distantPast }
        }
    }
    /// What the user decides at the authorization endpoint from now on.
    public func setAuthorizationDecision(_ decision: Decision) { state.withLock { $0.login.decision = decision } }

    /// When the token endpoint received each device-code poll.
    public var devicePolls: [Date] { state.withLock { $0.login.devicePolls } }
    /// How many device authorizations were started.
    public var deviceAuthorizations: Int { state.withLock { $0.login.devices.count } }
    /// How many requests the authorization endpoint received.
    public var authorizationRequests: Int { state.withLock { $0.login.authorizationRequests } }
    /// Every id token issued.
    public var issuedIDTokens: [String] { state.withLock { $0.login.issuedIDTokens } }
    /// Why each refused code exchange was refused (`invalid_grant` descriptions).
    public var rejectedCodeExchanges: [String] { state.withLock { $0.login.rejectedCodeExchanges } }

    /// Plays the user at the device verification page: GETs `verificationURIComplete` with
    /// `&decision=approve` or `deny`; returns the page's HTTP status.
    public func decide(_ decision: Decision, at verificationURIComplete: String) async throws -> Int {
        let word = decision == .approve ? "approve" : "deny"
        return try await TestBrowser.get(verificationURIComplete + "&decision=\(word)").status
    }

    /// Plays a client at the token endpoint: exchanges `code` with `verifier` for `redirectURI`
    /// (client_secret_post); returns the HTTP status.
    public func exchange(code: String, verifier: String, redirectURI: String) async throws -> Int {
        let form = [
            ("grant_type", "authorization_code"), ("code", code), ("code_verifier", verifier),
            ("redirect_uri", redirectURI), ("client_id", clientID), ("client_secret", clientSecret),
        ].map { "\($0.0)=\(FormBody.escape($0.1))" }.joined(separator: "&")
        return try await TestBrowser.post(tokenEndpoint, form: form).status
    }

    /// The S256 code challenge of `verifier` (RFC 7636 section 4.2), computed as the IdP checks it.
    public static func challenge(for verifier: String) -> String { s256(verifier) }

    // MARK: Endpoints

    /// The answer of a login endpoint, or `nil` when `request` is for another endpoint.
    static func loginEndpoint(_ request: TestHTTPRequest, state: Box<State>, clientID: String, clientSecret: String)
        -> Answer?
    {
        switch (request.method, request.path) {
        case (.POST, "/device/code"):
            let form = FormBody.parse(request.body)
            let client = client(form, authorization: request.header("Authorization"))
            let base = "http://" + (request.header("Host") ?? "127.0.0.1")
            return state.withLock { state in
                deviceAuthorization(
                    form, client: client, base: base, state: &state, clientID: clientID,
                    clientSecret: clientSecret)
            }
        case (.GET, "/device"):
            let query = FormBody.parse(request.query ?? "")
            return state.withLock { verification(query, state: &$0) }
        case (.GET, "/authorize"):
            let query = FormBody.parse(request.query ?? "")
            return state.withLock { authorize(query, state: &$0, clientID: clientID) }
        default:
            return nil
        }
    }

    /// RFC 8628 section 3.2.
    private static func deviceAuthorization(
        _ form: [String: String], client: (id: String?, secret: String?), base: String, state: inout State,
        clientID: String, clientSecret: String
    ) -> Answer {
        guard state.login.offersDeviceEndpoint else { return Answer(status: .notFound, body: "{}") }
        if let fault = state.behavior.response(errorBody: #"{"error":"temporarily_unavailable"}"#) { return fault }
        guard client.id == clientID, client.secret == nil || client.secret == clientSecret else {
            return Answer(status: .unauthorized, body: #"{"error":"invalid_client"}"#)
        }
        let letters = Array("BCDFGHJKLMNPQRSTVWXZ")
        let userCode =
            String((0..<4).map { _ in letters.randomElement()! }) + "-"
            + String((0..<4).map { _ in letters.randomElement()! })
        let deviceCode = "dc-\(randomSuffix())-\(randomSuffix())"
        let login = state.login
        state.login.devices.append(
            DeviceAuthorization(
                deviceCode: deviceCode, userCode: userCode, scope: form["scope"],
                expiresAt: login.deviceClock().addingTimeInterval(Double(login.deviceExpiresIn)),
                interval: login.deviceInterval))
        let body = """
            {"device_code":"\(deviceCode)","user_code":"\(userCode)","verification_uri":"\(base)/device",\
            "verification_uri_complete":"\(base)/device?user_code=\(userCode)","expires_in":\(login.deviceExpiresIn),\
            "interval":\(login.deviceInterval)}
            """
        return Answer(status: .ok, body: body)
    }

    /// The verification page: `decision=approve|deny` with a known `user_code` records the user's choice.
    private static func verification(_ query: [String: String], state: inout State) -> Answer {
        guard let index = state.login.devices.firstIndex(where: { $0.userCode == query["user_code"] }) else {
            return Answer(status: .notFound, body: "unknown code")
        }
        switch query["decision"] {
        case "approve": state.login.devices[index].decision = .approve
        case "deny": state.login.devices[index].decision = .deny
        default: return Answer(status: .ok, body: "enter the code")
        }
        return Answer(status: .ok, body: "done")
    }

    /// The device-code grant (RFC 8628 section 3.5).
    static func deviceGrant(_ form: [String: String], state: inout State, clientID: String, delay: Duration)
        -> Answer
    {
        let now = state.login.deviceClock()
        state.login.devicePolls.append(now)
        let error: (String) -> Answer = {
            Answer(status: .badRequest, body: #"{"error":"\#($0)"}"#, delay: delay)
        }
        guard let index = state.login.devices.firstIndex(where: { $0.deviceCode == form["device_code"] }) else {
            return error("invalid_grant")
        }
        let device = state.login.devices[index]
        state.login.devices[index].lastPoll = now
        if state.login.forcedSlowDowns > 0
            || device.lastPoll.map({ now.timeIntervalSince($0) < Double(device.interval) }) == true
        {
            state.login.forcedSlowDowns = max(0, state.login.forcedSlowDowns - 1)
            state.login.devices[index].interval += 5
            return error("slow_down")
        }
        if device.used { return error("invalid_grant") }
        if device.expiresAt <= now { return error("expired_token") }
        switch device.decision {
        case nil: return error("authorization_pending")
        case .deny: return error("access_denied")
        case .approve:
            state.login.devices[index].used = true
            state.login.grantedScope = device.scope
            return Answer(
                status: .ok, body: issue(&state, idToken: hasOpenID(device.scope), clientID: clientID), delay: delay)
        }
    }

    /// The authorization endpoint: a registered redirect URI, PKCE S256 and a `state`, else 400
    /// and no redirect; then a redirect with a code (or `access_denied`).
    private static func authorize(_ query: [String: String], state: inout State, clientID: String) -> Answer {
        state.login.authorizationRequests += 1
        state.dpop.authorizationJKT = query["dpop_jkt"]
        guard query["client_id"] == clientID, let redirect = query["redirect_uri"], isRegistered(redirect) else {
            return Answer(status: .badRequest, body: "unknown client or unregistered redirect_uri")
        }
        let back: (String) -> Answer = { parameters in
            let separator = redirect.contains("?") ? "&" : "?"
            return Answer(status: .found, body: "", headers: [("Location", redirect + separator + parameters)])
        }
        let returnedState = "&state=" + FormBody.escape(query["state"] ?? "")
        guard query["response_type"] == "code", query["code_challenge_method"] == "S256",
            let challenge = query["code_challenge"], challenge.count >= 43, let given = query["state"], !given.isEmpty
        else {
            return back("error=invalid_request" + returnedState)
        }
        if state.login.decision == .deny { return back("error=access_denied" + returnedState) }
        let code = "code-\(randomSuffix())-\(randomSuffix())"
        state.login.codes[code] = IssuedCode(
            clientID: clientID, redirectURI: redirect, challenge: challenge, scope: query["scope"],
            dpopJKT: query["dpop_jkt"])
        return back("code=\(code)" + returnedState)
    }

    /// The authorization-code grant: the code once, with the redirect URI it was issued for and
    /// the verifier of its challenge.
    static func codeGrant(_ form: [String: String], state: inout State, clientID: String, delay: Duration) -> Answer {
        func refuse(_ reason: String, _ state: inout State) -> Answer {
            state.login.rejectedCodeExchanges.append(reason)
            return Answer(
                status: .badRequest, body: #"{"error":"invalid_grant","error_description":"\#(reason)"}"#,
                delay: delay)
        }
        guard let code = form["code"], let issued = state.login.codes[code] else {
            return refuse("unknown code", &state)
        }
        guard !issued.used else { return refuse("code already used", &state) }
        state.login.codes[code]?.used = true
        guard issued.clientID == clientID else { return refuse("code of another client", &state) }
        guard form["redirect_uri"] == issued.redirectURI else { return refuse("redirect_uri differs", &state) }
        guard let verifier = form["code_verifier"], s256(verifier) == issued.challenge else {
            return refuse("code_verifier does not match", &state)
        }
        guard state.dpop.allows(boundTo: issued.dpopJKT) else { return refuse("DPoP key is not dpop_jkt", &state) }
        state.login.grantedScope = issued.scope
        return Answer(
            status: .ok, body: issue(&state, idToken: hasOpenID(issued.scope), clientID: clientID), delay: delay)
    }

    // MARK: Helpers

    /// RFC 8252 section 7.3: `http://127.0.0.1:<any port>/callback`.
    private static func isRegistered(_ redirect: String) -> Bool {
        guard let components = URLComponents(string: redirect) else { return false }
        return components.scheme == "http" && components.host == "127.0.0.1" && components.port != nil
            && components.path == "/callback" && components.query == nil
    }

    static func hasOpenID(_ scope: String?) -> Bool {
        scope?.split(separator: " ").contains("openid") == true
    }

    /// An unsigned JWT-shaped id token with `exp`.
    static func makeIDToken(_ state: inout State, clientID: String) -> String {
        let expiry = state.login.idTokenExpiry ?? Date().addingTimeInterval(3600)
        let header = #"{"alg":"none","typ":"JWT"}"#
        let payload =
            #"{"iss":"test-idp","sub":"user-1","aud":"\#(clientID)","exp":\#(Int(expiry.timeIntervalSince1970)),"nonce":"\#(randomSuffix())"}"#
        let token = base64URL(Data(header.utf8)) + "." + base64URL(Data(payload.utf8)) + "."
        state.login.issuedIDTokens.append(token)
        return token
    }

    /// The S256 code challenge of `verifier` (RFC 7636 section 4.2).
    static func s256(_ verifier: String) -> String {
        let input = Array(verifier.utf8)
        var digest = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
        _ = sodium_init()
        crypto_hash_sha256(&digest, input, UInt64(input.count))
        return base64URL(Data(digest))
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}
