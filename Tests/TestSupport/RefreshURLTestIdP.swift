import FoundationEssentials
import NIOHTTP1

/// A real "refresh_url" server, on 127.0.0.1 or in process (`TestIdPServing`) (seed 000): the refresh credential is a secret URL
/// that works once. Calling it answers `{"access_token", "refresh_url", "expires_in"}` with a NEW
/// URL; the used URL (and any unknown one) then gets `401`.
public final class RefreshURLTestIdP: Sendable {
    /// How the next refresh calls are answered (the same faults every test IdP imitates).
    public typealias Behavior = OAuth2TestIdP.Behavior

    /// One request the server received.
    public struct Call: Sendable, Equatable {
        /// The full URL that was called.
        public var url: String
        public var method: String
        public var at: Date
    }

    private struct State {
        var current: String?
        var serial = 0
        var issuedURLs: [String] = []
        var issuedAccessTokens: [String] = []
        var calls: [Call] = []
        var rejectedReuse = 0
        var behavior = Behavior.normal
        var lifetime: Int
    }

    private let state: Box<State>
    private let server: any TestIdPHost

    /// The first valid refresh URL; give it to the broker with `tokens.refresh_url`.
    public let initialURL: String

    public init(lifetime: Int = 3600, serving: TestIdPServing = .http) async throws {
        let secret = "r0-\(randomSuffix())-\(randomSuffix())"
        let state = Box(State(current: secret, lifetime: lifetime))
        self.state = state
        let server = try await serving.start { request in Self.answer(request, state: state) }
        self.server = server
        initialURL = server.baseURL + "/refresh/" + secret
    }

    /// Stops listening.
    public func shutdown() async {
        await server.shutdown()
    }

    // MARK: Controls and observations

    public func setBehavior(_ behavior: Behavior) { state.withLock { $0.behavior = behavior } }
    public func setLifetime(_ seconds: Int) { state.withLock { $0.lifetime = seconds } }
    /// Invalidates the current URL, as a user revoking the session would.
    public func revoke() { state.withLock { $0.current = nil } }
    /// A new login: returns a fresh valid URL (the only valid one from now on).
    public func reissue() -> String {
        let secret = "login-\(randomSuffix())-\(randomSuffix())"
        state.withLock { $0.current = secret }
        return server.baseURL + "/refresh/" + secret
    }

    public var calls: [Call] { state.withLock { $0.calls } }
    public var callCount: Int { state.withLock { $0.calls.count } }
    /// Every refresh URL handed out, in order (not counting `initialURL`).
    public var issuedURLs: [String] { state.withLock { $0.issuedURLs } }
    public var issuedAccessTokens: [String] { state.withLock { $0.issuedAccessTokens } }
    /// How many calls used a URL that was not the current one.
    public var rejectedReuse: Int { state.withLock { $0.rejectedReuse } }

    private static func answer(_ request: TestHTTPRequest, state: Box<State>) -> TestHTTPResponse {
        let host = request.header("Host") ?? "127.0.0.1"
        let called = "http://\(host)\(request.path)" + (request.query.map { "?" + $0 } ?? "")
        return state.withLock { state in
            state.calls.append(Call(url: called, method: request.method.rawValue, at: Date()))
            if let fault = state.behavior.response(errorBody: #"{"error":"unavailable"}"#) { return fault }
            let prefix = "/refresh/"
            guard request.path.hasPrefix(prefix), let current = state.current,
                String(request.path.dropFirst(prefix.count)) == current
            else {
                state.rejectedReuse += 1
                return TestHTTPResponse(status: .unauthorized, body: #"{"error":"invalid_refresh_url"}"#)
            }
            state.serial += 1
            let next = "r\(state.serial)-\(randomSuffix())-\(randomSuffix())"
            let access = "url-at-\(state.serial)-\(randomSuffix())"
            let url = "http://\(host)\(prefix)\(next)"
            state.current = next
            state.issuedURLs.append(url)
            state.issuedAccessTokens.append(access)
            let body = #"{"access_token":"\#(access)","refresh_url":"\#(url)","expires_in":\#(state.lifetime)}"#
            return TestHTTPResponse(status: .ok, body: body)
        }
    }
}
