import Foundation
import NIOHTTP1

/// A real sliding-refresh-token endpoint, on 127.0.0.1 or in process (`TestIdPServing`) (seed 004): `POST /api/Auth/RefreshToken`
/// with `Authorization: Bearer <refresh token>`. Every refresh token works once and only until
/// its expiry; each refresh returns a new one with a fresh expiry (the sliding window). Answers
/// use the envelope `{status, message, data{accessToken, refreshToken, accessTokenExpiresAt,
/// refreshTokenExpiresAt}}` with zone-less timestamps in the server's time zone. A reused token
/// gets `{"status": false, "message": "RefreshTokenMismatch"}`, an expired one
/// `"RefreshTokenExpired"`, both with HTTP 200 so only the envelope tells.
public final class SlidingTestIdP: Sendable {
    /// How the next refresh calls are answered (the same faults every test IdP imitates).
    public typealias Behavior = OAuth2TestIdP.Behavior

    /// One request the endpoint received.
    public struct Call: Sendable, Equatable {
        /// The bearer token presented, if any.
        public var refreshToken: String?
        public var method: String
        public var at: Date
    }

    private struct State {
        var currentRefreshToken: String
        var currentRefreshExpiresAt: Date
        var serial = 0
        var issuedRefreshTokens: [String] = []
        var issuedAccessTokens: [String] = []
        var calls: [Call] = []
        var rejectedReuse = 0
        var rejectedExpired = 0
        var behavior = Behavior.normal
        var accessLifetime: Int
        var refreshLifetime: Int
    }

    private let state: Box<State>
    private let server: any TestIdPHost
    /// The IANA zone of the timestamps (which carry no zone themselves).
    public let timeZone: String
    /// When `initialRefreshToken` lapses (whole seconds).
    public let initialRefreshExpiresAt: Date

    /// The refresh endpoint's URL.
    public var endpoint: String { server.baseURL + "/api/Auth/RefreshToken" }

    /// Starts the server; `initialRefreshToken` is valid for `refreshLifetime` seconds from now.
    public init(
        initialRefreshToken: String = "srt-0", accessLifetime: Int = 1800, refreshLifetime: Int = 7 * 86400,
        timeZone: String = "UTC", serving: TestIdPServing = .http
    ) async throws {
        self.timeZone = timeZone
        let expiry = Date(
            timeIntervalSince1970: (Date().timeIntervalSince1970 + Double(refreshLifetime)).rounded(.down))
        initialRefreshExpiresAt = expiry
        let state = Box(
            State(
                currentRefreshToken: initialRefreshToken, currentRefreshExpiresAt: expiry,
                accessLifetime: accessLifetime, refreshLifetime: refreshLifetime))
        self.state = state
        let zone = TimeZone(identifier: timeZone)!
        server = try await serving.start { request in Self.answer(request, state: state, zone: zone) }
    }

    /// Stops listening.
    public func shutdown() async {
        await server.shutdown()
    }

    // MARK: Controls and observations

    public func setBehavior(_ behavior: Behavior) { state.withLock { $0.behavior = behavior } }
    public func setLifetimes(access: Int, refresh: Int) {
        state.withLock {
            $0.accessLifetime = access
            $0.refreshLifetime = refresh
        }
    }

    public var calls: [Call] { state.withLock { $0.calls } }
    public var callCount: Int { state.withLock { $0.calls.count } }
    public var issuedRefreshTokens: [String] { state.withLock { $0.issuedRefreshTokens } }
    public var issuedAccessTokens: [String] { state.withLock { $0.issuedAccessTokens } }
    /// Calls that presented a refresh token other than the current one.
    public var rejectedReuse: Int { state.withLock { $0.rejectedReuse } }
    /// Calls that presented the current refresh token after it had expired.
    public var rejectedExpired: Int { state.withLock { $0.rejectedExpired } }

    /// `2026-01-06T14:18:40`: whole seconds, no zone, in `zone` (as the seed's server writes them).
    public static func format(_ date: Date, zone: TimeZone) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.calendar = Calendar(identifier: .gregorian)
        formatter.timeZone = zone
        formatter.dateFormat = "yyyy-MM-dd'T'HH:mm:ss"
        return formatter.string(from: date)
    }

    private static func answer(_ request: TestHTTPRequest, state: Box<State>, zone: TimeZone) -> TestHTTPResponse {
        let authorization = request.header("Authorization")
        let presented = authorization.flatMap { $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }
        let now = Date()
        return state.withLock { state in
            state.calls.append(Call(refreshToken: presented, method: request.method.rawValue, at: now))
            if let fault = state.behavior.response(
                errorBody: #"{"status":false,"message":"ServiceUnavailable","data":null}"#)
            {
                return fault
            }
            guard request.method == .POST, request.path == "/api/Auth/RefreshToken" else {
                return TestHTTPResponse(status: .notFound, body: #"{"status":false,"message":"NotFound","data":null}"#)
            }
            guard presented == state.currentRefreshToken else {
                state.rejectedReuse += 1
                return TestHTTPResponse(
                    status: .ok, body: #"{"status":false,"message":"RefreshTokenMismatch","data":null}"#)
            }
            guard now < state.currentRefreshExpiresAt else {
                state.rejectedExpired += 1
                return TestHTTPResponse(
                    status: .ok, body: #"{"status":false,"message":"RefreshTokenExpired","data":null}"#)
            }
            state.serial += 1
            let access = "sl-at-\(state.serial)-\(randomSuffix())"
            let refresh = "sl-rt-\(state.serial)-\(randomSuffix())"
            // Expiries are truncated to whole seconds, as sent, so the server checks what it said.
            let accessExpiry = Date(
                timeIntervalSince1970: (now.timeIntervalSince1970 + Double(state.accessLifetime)).rounded(.down))
            let refreshExpiry = Date(
                timeIntervalSince1970: (now.timeIntervalSince1970 + Double(state.refreshLifetime)).rounded(.down))
            state.currentRefreshToken = refresh
            state.currentRefreshExpiresAt = refreshExpiry
            state.issuedAccessTokens.append(access)
            state.issuedRefreshTokens.append(refresh)
            let body = """
                {"status":true,"message":"TokenRefreshedSuccessfully","data":{"accessToken":"\(access)",\
                "refreshToken":"\(refresh)","accessTokenExpiresAt":"\(format(accessExpiry, zone: zone))",\
                "refreshTokenExpiresAt":"\(format(refreshExpiry, zone: zone))"}}
                """
            return TestHTTPResponse(status: .ok, body: body)
        }
    }
}
