import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import NIOHTTP1

/// An identity provider's answer, read whole (bounded).
package struct IdPReply: Sendable {
    package var status: Int
    package var body: Data
    /// `Retry-After`, in seconds, from either of its two forms.
    package var retryAfter: TimeInterval?
    /// `DPoP-Nonce` (RFC 9449 section 8), as sent.
    package var dpopNonce: String? = nil

    /// Whether the IdP refused a DPoP proof for lacking its nonce (RFC 9449 section 8).
    package var asksForDPoPNonce: Bool { dpopError == "use_dpop_nonce" }

    /// The IdP's refusal of a DPoP proof (RFC 9449 sections 5 and 8: `invalid_dpop_proof`,
    /// `use_dpop_nonce`), which says nothing of the credential.
    package var dpopError: String? {
        guard status == 400 || status == 401, let code = JSONValue.object(decoding: body)?["error"]?.text,
            code == "use_dpop_nonce" || code == "invalid_dpop_proof"
        else { return nil }
        return code
    }
}

/// The IdP client every provider, login and discovery shares: which URLs may be called (https,
/// plain http on loopback only), bounded answers (1 MiB) within `request_timeout`, and failure
/// messages that name the endpoint without any secret. The exchange itself goes through an
/// `IdPTransport`: `HTTPIdPTransport` in the broker, an in-process one in the engine's tests.
public final class IdPClient: Sendable {
    private let transport: any IdPTransport
    private let requestTimeout: TimeInterval
    /// Discovered OIDC token endpoints, shared by every account that names an issuer.
    package let discovery = DiscoveryCache()
    /// The nonce each IdP last gave for DPoP proofs.
    package let dpopNonces = DPoPNonces()

    /// The broker's client: HTTP over the network.
    public convenience init(settings: BrokerSettings) {
        self.init(settings: settings, transport: HTTPIdPTransport(settings: settings))
    }

    /// A client whose exchanges go through `transport`.
    public init(settings: BrokerSettings, transport: any IdPTransport) {
        self.transport = transport
        requestTimeout = settings.requestTimeout
    }

    /// Closes idle connections; call once before exit.
    public func shutdown() async {
        await transport.shutdown()
    }

    /// Sends one request and reads the whole answer (bounded). `target` names the endpoint in
    /// failure messages; pass it for secret URLs (e.g. "the refresh URL"), whose host and path
    /// must never appear in a message. Without it, messages name the IdP's host.
    /// `public`: the answer carries no secret (a discovery document), so its buffer is left as is.
    package func send(
        method: HTTPMethod, url: URL, headers: HTTPHeaders, body: String? = nil, target: String? = nil,
        public: Bool = false
    ) async -> Result<IdPReply, RefreshFailure> {
        guard EndpointPolicy.isAllowed(url) else {
            return .failure(
                .denial("\(target ?? "the IdP URL") must use https (plain http is allowed for loopback only)"))
        }
        let request = IdPRequest(
            method: method, url: url, headers: headers, body: body, bodyLimit: 1 << 20, timeout: requestTimeout,
            isPublic: `public`)
        switch await transport.exchange(request) {
        case .success(let answer):
            return .success(
                IdPReply(
                    status: answer.status, body: answer.body,
                    retryAfter: answer.headers.first(name: "Retry-After").flatMap(Self.retryAfter),
                    dpopNonce: answer.headers.first(name: "DPoP-Nonce")))
        case .failure(let failure):
            let name = target ?? "the IdP at \(Self.hostAndPort(url))"
            return .failure(.transient("cannot reach \(name): \(failure.reason)"))
        }
    }

    /// A form POST to a token endpoint; with `proof`, carrying a DPoP proof (RFC 9449 section 5)
    /// of that key, made as it is sent (its `iat` that of `proof.at`, which the caller's clock
    /// gives), with the last nonce the IdP gave. An answer that asks for a new nonce is retried
    /// once with it.
    package func post(
        _ url: URL, headers: HTTPHeaders, body: String, proof: (key: DPoPKey, at: @Sendable () -> Date)? = nil
    ) async -> Result<IdPReply, RefreshFailure> {
        guard let (proofKey, clock) = proof else {
            return await send(method: .POST, url: url, headers: headers, body: body)
        }
        let first = await post(url, headers: headers, body: body, proof: proofKey, now: clock())
        guard case .success(let answer) = first.reply, answer.asksForDPoPNonce,
            let nonce = dpopNonces.nonce(for: url), nonce != first.nonce
        else { return first.reply }
        return await post(url, headers: headers, body: body, proof: proofKey, now: clock()).reply
    }

    /// One POST with a proof carrying the IdP's last nonce; keeps the nonce the answer gives.
    private func post(_ url: URL, headers: HTTPHeaders, body: String, proof key: DPoPKey, now: Date) async -> (
        reply: Result<IdPReply, RefreshFailure>, nonce: String?
    ) {
        // The proof's `htu`: the endpoint without query and fragment (RFC 9449 section 4.2), in
        // the normal form programs' proofs have too.
        let target =
            NormalizedURL(url.absoluteString)?.description ?? DPoPTarget.withoutQueryAndFragment(url.absoluteString)
        let nonce = dpopNonces.nonce(for: url)
        guard let proof = key.proof(method: "POST", url: target, now: now, nonce: nonce) else {
            return (.failure(.denial("the account's DPoP key cannot sign; log in again")), nonce)
        }
        var headers = headers
        headers.replaceOrAdd(name: "DPoP", value: proof)
        let reply = await send(method: .POST, url: url, headers: headers, body: body)
        if case .success(let answer) = reply, let given = answer.dpopNonce { dpopNonces.remember(given, for: url) }
        return (reply, nonce)
    }

    /// `host:port` of `url`, the port given or the scheme's, for messages about reaching it.
    package static func hostAndPort(_ url: URL) -> String {
        "\(url.host ?? "?"):\(url.port ?? (url.scheme == "http" ? 80 : 443))"
    }

    /// `Retry-After` in seconds (RFC 9110 section 10.2.3: delay-seconds, or an HTTP-date), at
    /// most `Bounds.maximumLifetime`; callers cut it further to `backoff_cap`. `nil` when unreadable.
    package static func retryAfter(_ value: String) -> TimeInterval? {
        let text = value.trimmingSpaces()
        if !text.isEmpty, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            return Bounds.lifetime(Double(text) ?? .infinity) ?? Bounds.maximumLifetime
        }
        return httpDate(text).flatMap { Bounds.lifetime(max(0, $0.timeIntervalSinceNow)) }
    }

    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110 section 5.6.7), read by hand:
    /// Foundation's `DateFormatter` traps on some non-ASCII input (found by fuzzing).
    package static func httpDate(_ text: String) -> Date? {
        guard text.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else { return nil }
        let parts = text.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 6, parts[0].count == 4, parts[0].hasSuffix(","), parts[5] == "GMT",
            let month = months.firstIndex(of: String(parts[2]))
        else { return nil }
        let iso = "\(parts[3])-\(month < 9 ? "0" : "")\(month + 1)-\(parts[1])T\(parts[4])Z"
        return Timestamp.parse(iso, defaultZone: .utc)
    }
}
