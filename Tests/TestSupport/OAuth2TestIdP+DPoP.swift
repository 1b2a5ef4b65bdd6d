import Foundation
import NIOHTTP1

/// The test IdP as a DPoP authorization server (RFC 9449), off until `requireDPoP`: every
/// token request then needs a valid proof (section 4.3), answered `invalid_dpop_proof` else;
/// with a nonce, a proof without the current one is answered `use_dpop_nonce` and the nonce
/// (section 8). Tokens are `token_type` DPoP, each access token bound to the proof's key, and
/// refresh tokens of public clients too (section 5): a refresh with another key is
/// `invalid_grant`, as is a code exchange whose key is not the `dpop_jkt` of its authorization
/// request (section 10).
extension OAuth2TestIdP {
    /// What DPoP mode keeps.
    struct DPoPState {
        var required = false
        /// Answer `token_type` Bearer and bind nothing, as an IdP that ignores DPoP does.
        var answersBearer = false
        /// The nonce proofs must carry; `nil`: none is demanded.
        var nonce: String?
        var verifier = DPoPVerifier()
        /// The time proofs' `iat` is held to: the engine tests' manual clock, or the real one.
        var clock: @Sendable () -> Date = { Date() }
        var proofsSeen = 0
        var refusals: [String] = []
        /// The key thumbprint each access token and refresh token is bound to.
        var accessBindings: [String: String] = [:]
        var refreshBindings: [String: String] = [:]
        /// The `dpop_jkt` of the last authorization request.
        var authorizationJKT: String?
        /// The key of the token request being answered, and whether its client is public (sent
        /// no secret); set by `dpopRefusal`, read while the same lock is held.
        var presentedKey: String?
        var presentedByPublicClient = false

        /// The key the tokens being issued are bound to: none when DPoP is off or ignored.
        var bindingKey: String? { required && !answersBearer ? presentedKey : nil }

        var tokenType: String { bindingKey == nil ? "Bearer" : "DPoP" }

        /// The `DPoP-Nonce` header every token endpoint answer carries while a nonce is demanded.
        var nonceHeaders: [(String, String)] { required ? nonce.map { [("DPoP-Nonce", $0)] } ?? [] : [] }

        /// Binds newly issued tokens to the presented key (a refresh token only for a public client).
        mutating func bind(access: String, refresh: String) {
            guard let key = bindingKey else { return }
            accessBindings[access] = key
            if presentedByPublicClient { refreshBindings[refresh] = key }
        }

        /// Whether the presented key may use a grant bound to `bound`; a refusal is recorded.
        mutating func allows(boundTo bound: String?) -> Bool {
            guard required, let bound, bound != presentedKey else { return true }
            refusals.append(DPoPRefusal.jkt.reason)
            return false
        }
    }

    /// What the token endpoint needs of a request to check its proof.
    struct DPoPRequest {
        var proofs: [String]
        var method: String
        /// The URL as this server sees it: its `Host` and the path.
        var url: String

        init(_ request: TestHTTPRequest) {
            proofs = request.headers["DPoP"]
            method = request.method.rawValue
            url = "http://" + (request.header("Host") ?? "127.0.0.1") + request.path
        }
    }

    // MARK: Controls and observations

    /// From now on, token requests need a DPoP proof and get DPoP-bound tokens; with `nonce`,
    /// proofs must carry the nonce this IdP issues. `clock` is the time their `iat` must be near.
    public func requireDPoP(nonce: Bool = false, clock: @escaping @Sendable () -> Date = { Date() }) {
        state.withLock { state in
            state.dpop.required = true
            state.dpop.clock = clock
            state.dpop.nonce = nonce ? Self.newNonce() : nil
        }
    }

    /// Issues a new nonce: proofs carrying the old one are answered `use_dpop_nonce`.
    public func rotateDPoPNonce() {
        state.withLock { state in
            precondition(state.dpop.nonce != nil, "rotateDPoPNonce without requireDPoP(nonce: true)")
            state.dpop.nonce = Self.newNonce()
        }
    }

    /// Makes the IdP answer `token_type` Bearer with unbound tokens, as an IdP that ignores DPoP
    /// does; in DPoP mode it still checks the proofs, so a test sees that the client sent good ones.
    public func answerBearer(_ yes: Bool) { state.withLock { $0.dpop.answersBearer = yes } }

    /// The nonce proofs must carry now, if one is demanded.
    public var dpopNonce: String? { state.withLock { $0.dpop.nonce } }
    /// The thumbprint of the key `token` is bound to (`nil`: unbound or unknown).
    public func boundThumbprint(ofAccessToken token: String) -> String? {
        state.withLock { $0.dpop.accessBindings[token] }
    }
    /// The thumbprint of the key refresh token `token` is bound to (only public clients' are).
    public func boundThumbprint(ofRefreshToken token: String) -> String? {
        state.withLock { $0.dpop.refreshBindings[token] }
    }
    /// How many `DPoP` header values token requests carried, in DPoP mode or not.
    public var dpopProofsSeen: Int { state.withLock { $0.dpop.proofsSeen } }
    /// Why each refused proof was refused (`DPoPRefusal.reason`; `jkt` for a grant bound to
    /// another key), in order.
    public var dpopRefusals: [String] { state.withLock { $0.dpop.refusals } }
    /// The `dpop_jkt` the last authorization request carried, `nil` if none.
    public var authorizationDPoPJKT: String? { state.withLock { $0.dpop.authorizationJKT } }

    /// Plays a client at the token endpoint: posts `fields` with a `DPoP` header per proof.
    public func tokenRequest(_ fields: [(String, String)], proofs: [String]) async throws -> TestHTTPClient.Reply {
        try await TestHTTPClient.post(tokenEndpoint, form: fields, headers: proofs.map { ("DPoP", $0) })
    }

    /// Plays a client refreshing with `refreshToken` and `proof`: a confidential one (its secret
    /// in the form) or a public one.
    public func refresh(_ refreshToken: String, proof: String?, confidential: Bool = true) async throws
        -> TestHTTPClient.Reply
    {
        var fields = [("grant_type", "refresh_token"), ("refresh_token", refreshToken), ("client_id", clientID)]
        if confidential { fields.append(("client_secret", clientSecret)) }
        return try await tokenRequest(fields, proofs: proof.map { [$0] } ?? [])
    }

    // MARK: Endpoint

    /// Checks the proof of a token request in DPoP mode and notes its key; the answer refusing
    /// it, or `nil`.
    static func dpopRefusal(_ request: DPoPRequest, publicClient: Bool, state: inout State, delay: Duration)
        -> Answer?
    {
        state.dpop.presentedKey = nil
        state.dpop.proofsSeen += request.proofs.count
        guard state.dpop.required else { return nil }
        do throws(DPoPRefusal) {
            state.dpop.presentedKey = try state.dpop.verifier.verify(
                proofs: request.proofs, method: request.method, url: request.url, now: state.dpop.clock(),
                nonce: state.dpop.nonce)
            state.dpop.presentedByPublicClient = publicClient
            return nil
        } catch {
            state.dpop.refusals.append(error.reason)
            let code = error == .nonce ? "use_dpop_nonce" : "invalid_dpop_proof"
            return Answer(
                status: .badRequest, body: #"{"error":"\#(code)","error_description":"\#(error)"}"#, delay: delay)
        }
    }

    /// 128 random bits, base64url.
    private static func newNonce() -> String {
        DPoPVerifier.base64URL(Data((0..<16).map { _ in UInt8.random(in: 0...255) }))
    }
}
