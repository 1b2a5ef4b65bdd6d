import Foundation
import NIOHTTP1

/// A protected resource that takes the test IdP's DPoP-bound access tokens as RFC 9449
/// section 7 says: `Authorization: DPoP <token>` for a token the IdP issued and still holds
/// valid, with one proof for this request's method and URL, the token's `ath` and the key the
/// token is bound to; `Authorization: Bearer` only for unbound tokens (section 7.2). Anything
/// else is 401 with a `WWW-Authenticate: DPoP` challenge. Every path answers `{"ok":true}`.
public final class DPoPResourceServer: Sendable {
    struct State {
        var baseURL = ""
        /// The nonce proofs must carry (section 9); `nil`: none is demanded.
        var nonce: String?
        var refusals: [String] = []
        var successes = 0
    }

    /// Why a request was refused: its RFC 6750 error code (`nil`: no credentials at all) and
    /// the reason recorded (a `DPoPRefusal.reason` for a proof).
    private struct Refusal: Error {
        var error: String?
        var reason: String
    }

    private let state: Box<State>
    private let server: any TestIdPHost

    /// Starts serving; `idp` says which tokens are valid and what each is bound to.
    public init(idp: OAuth2TestIdP, serving: TestIdPServing = .http) async throws {
        let state = Box(State())
        let verifier = DPoPVerifier()
        self.state = state
        server = try await serving.start { request in
            Self.answer(request, idp: idp, verifier: verifier, state: state)
        }
        let base = server.baseURL
        state.withLock { $0.baseURL = base }
    }

    /// Stops listening.
    public func shutdown() async { await server.shutdown() }

    /// The resource's URL.
    public var url: String { server.baseURL + "/items" }

    /// From now on, proofs must carry the nonce this server issues.
    public func requireNonce() {
        state.withLock { $0.nonce = DPoPVerifier.base64URL(Data((0..<16).map { _ in UInt8.random(in: 0...255) })) }
    }

    /// Why each refused request was refused, in order.
    public var refusals: [String] { state.withLock { $0.refusals } }
    /// How many requests were answered 200.
    public var successes: Int { state.withLock { $0.successes } }

    /// Plays a client: `method` to `url` (the resource's by default) with `Authorization:
    /// <scheme> <token>` when `token` is given and a `DPoP` header per proof.
    public func request(
        _ method: String = "GET", url: String? = nil, token: String?, scheme: String = "DPoP", proofs: [String] = []
    ) async throws -> TestHTTPClient.Reply {
        let authorization = token.map { [("Authorization", "\(scheme) \($0)")] } ?? []
        return try await TestHTTPClient.send(
            method, url ?? self.url, headers: authorization + proofs.map { ("DPoP", $0) })
    }

    private static func answer(
        _ request: TestHTTPRequest, idp: OAuth2TestIdP, verifier: DPoPVerifier, state: Box<State>
    ) -> TestHTTPResponse {
        let (base, nonce) = state.withLock { ($0.baseURL, $0.nonce) }
        let url = base + request.path + (request.query.map { "?" + $0 } ?? "")
        let nonceHeaders = nonce.map { [("DPoP-Nonce", $0)] } ?? []
        do throws(Refusal) {
            try authorize(request, url: url, nonce: nonce, idp: idp, verifier: verifier)
            state.withLock { $0.successes += 1 }
            return TestHTTPResponse(status: .ok, body: #"{"ok":true}"#, headers: nonceHeaders)
        } catch {
            state.withLock { $0.refusals.append(error.reason) }
            let challenge = error.error.map { #"DPoP error="\#($0)", algs="ES256""# } ?? #"DPoP algs="ES256""#
            return TestHTTPResponse(
                status: error.error == "invalid_request" ? .badRequest : .unauthorized, body: "",
                headers: [("WWW-Authenticate", challenge)] + (error.error == "use_dpop_nonce" ? nonceHeaders : []))
        }
    }

    /// Returns when `request` may have the resource.
    private static func authorize(
        _ request: TestHTTPRequest, url: String, nonce: String?, idp: OAuth2TestIdP, verifier: DPoPVerifier
    ) throws(Refusal) {
        guard let authorization = request.header("Authorization") else { throw Refusal(reason: "no_token") }
        let parts = authorization.split(separator: " ", maxSplits: 1)
        guard parts.count == 2 else { throw Refusal(error: "invalid_request", reason: "authorization") }
        let token = String(parts[1])
        guard idp.accepted(token, at: Date(), grace: 0) else { throw Refusal(error: "invalid_token", reason: "token") }
        let bound = idp.boundThumbprint(ofAccessToken: token)
        switch parts[0].lowercased() {
        case "bearer":
            guard bound == nil else { throw Refusal(error: "invalid_token", reason: "bearer") }
        case "dpop":
            guard let bound else { throw Refusal(error: "invalid_token", reason: "unbound") }
            do throws(DPoPRefusal) {
                _ = try verifier.verify(
                    proofs: request.headers["DPoP"], method: request.method.rawValue, url: url, now: Date(),
                    accessToken: token, nonce: nonce, boundTo: bound)
            } catch {
                throw Refusal(error: error == .nonce ? "use_dpop_nonce" : "invalid_dpop_proof", reason: error.reason)
            }
        default:
            throw Refusal(error: "invalid_request", reason: "scheme")
        }
    }
}
