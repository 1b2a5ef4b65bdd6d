import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import NIOHTTP1
import Synchronization

/// OIDC discovery (OpenID Connect Discovery 1.0 section 4) for `oauth2` accounts configured
/// with an `issuer`: the issuer's token (and revocation) endpoint, fetched once and kept in
/// memory for every account that names the same issuer. A failed discovery is transient and
/// is not cached.
package actor DiscoveryCache {
    /// How long a discovered document is trusted before it is read again.
    package static let lifetime: TimeInterval = 24 * 3600

    /// Read without the actor by `known` and `knownDoors`, for advice given while the actor that
    /// asks is busy and for the refusal of proofs (`DPoPIdPEndpoints`), with the doors of the
    /// endpoints worked out once.
    private let documents = Mutex<[String: (endpoints: DiscoveredEndpoints, fetchedAt: Date, doors: [DPoPDoor])]>(
        [:])
    /// One discovery per issuer at a time; concurrent refreshes share it.
    private var inFlight: [String: Task<Result<DiscoveredEndpoints, RefreshFailure>, Never>] = [:]

    /// The token endpoint `issuer` advertises, from memory when known.
    package func tokenEndpoint(issuer: URL, http: IdPClient) async -> Result<URL, RefreshFailure> {
        await endpoints(issuer: issuer, http: http).map(\.token)
    }

    /// The endpoints `issuer` advertises, from memory when known and `fresh` is false; a fresh
    /// read (a login's, which must not act on what the IdP no longer offers) replaces the one kept.
    package func endpoints(issuer: URL, http: IdPClient, fresh: Bool = false) async -> Result<
        DiscoveredEndpoints, RefreshFailure
    > {
        let key = Self.normalized(issuer)
        if !fresh, let cached = documents.withLock({ $0[key] }),
            Date().timeIntervalSince(cached.fetchedAt) < Self.lifetime
        {
            return .success(cached.endpoints)
        }
        if let task = inFlight[key] { return await task.value }
        let task = Task { await Self.fetch(issuer: issuer, http: http) }
        inFlight[key] = task
        let result = await task.value
        inFlight[key] = nil
        if case .success(let endpoints) = result {
            let doors = endpoints.all.compactMap(DPoPDoor.init)
            documents.withLock { $0[key] = (endpoints, Date(), doors) }
        }
        return result
    }

    /// The endpoints `issuer` advertised when last read, however long ago; `nil` when never read.
    package nonisolated func known(issuer: URL) -> DiscoveredEndpoints? {
        documents.withLock { $0[Self.normalized(issuer)]?.endpoints }
    }

    /// The doors of the endpoints `issuer` advertised when last read; `nil` when never read.
    package nonisolated func knownDoors(issuer: URL) -> [DPoPDoor]? {
        documents.withLock { $0[Self.normalized(issuer)]?.doors }
    }

    private static func fetch(issuer: URL, http: IdPClient) async -> Result<DiscoveredEndpoints, RefreshFailure> {
        var headers = HTTPHeaders()
        headers.add(name: "Accept", value: "application/json")
        let target = "the discovery document of \(IdPClient.hostAndPort(issuer))"
        switch await http.send(
            method: .GET, url: documentURL(issuer: issuer), headers: headers, target: target, public: true)
        {
        case .success(let reply): return interpret(reply, issuer: issuer)
        case .failure(let failure): return .failure(.transient(failure.message, retryAfter: failure.retryAfter))
        }
    }

    /// `{issuer}/.well-known/openid-configuration`, with any trailing slash of the issuer removed.
    package static func documentURL(issuer: URL) -> URL {
        URL(string: normalized(issuer) + "/.well-known/openid-configuration")!
    }

    /// Reads `token_endpoint` (and `revocation_endpoint`, RFC 8414, `authorization_endpoint`,
    /// `device_authorization_endpoint`, RFC 8628, and, for the refusal of DPoP proofs only,
    /// `pushed_authorization_request_endpoint`, RFC 9126, and `introspection_endpoint`,
    /// RFC 8414) from a discovery document.
    /// Every failure is transient: the account's refresh credential is not in question.
    package static func interpret(_ reply: IdPReply, issuer: URL) -> Result<DiscoveredEndpoints, RefreshFailure> {
        let host = issuer.host ?? "?"
        guard (200..<300).contains(reply.status) else {
            return .failure(
                .transient(
                    "the discovery document of \(host) answered HTTP \(reply.status)", retryAfter: reply.retryAfter))
        }
        guard let object = JSONValue.object(decoding: reply.body) else {
            return .failure(.transient("the discovery document of \(host) is not a JSON object"))
        }
        // Section 4.3: the document must be about the issuer that was asked for.
        if let stated = object["issuer"]?.text, stated.trimmingSuffix("/") != normalized(issuer) {
            return .failure(.transient("the discovery document of \(host) names a different issuer"))
        }
        // Endpoints may live on other hosts than the issuer (Google's do), but never on plain
        // http when the issuer is https.
        guard let text = object["token_endpoint"]?.text, let endpoint = URL(string: text),
            EndpointPolicy.isAllowed(endpoint, handedOverBy: issuer)
        else {
            return .failure(
                .transient(
                    "the discovery document of \(host) has no usable token_endpoint (https, or http on loopback "
                        + "for an http issuer; a port from 1 to 65535)"))
        }
        // An unusable revocation, authorization or device endpoint only means logout cannot
        // revoke or that login flow is not offered; refreshes still work.
        let optional = { (field: String) -> URL? in
            (object[field]?.text).flatMap(URL.init(string:))
                .flatMap { EndpointPolicy.isAllowed($0, handedOverBy: issuer) ? $0 : nil }
        }
        return .success(
            DiscoveredEndpoints(
                token: endpoint, revocation: optional("revocation_endpoint"),
                authorization: optional("authorization_endpoint"),
                deviceAuthorization: optional("device_authorization_endpoint"),
                pushedAuthorizationRequest: optional("pushed_authorization_request_endpoint"),
                introspection: optional("introspection_endpoint")))
    }

    private static func normalized(_ issuer: URL) -> String { issuer.absoluteString.trimmingSuffix("/") }
}

/// What a discovery document says about where to send token requests.
package struct DiscoveredEndpoints: Sendable, Equatable {
    package var token: URL
    package var revocation: URL?
    package var authorization: URL? = nil
    package var deviceAuthorization: URL? = nil
    package var pushedAuthorizationRequest: URL? = nil
    package var introspection: URL? = nil

    /// Every endpoint named.
    package var all: [URL] {
        [token]
            + [revocation, authorization, deviceAuthorization, pushedAuthorizationRequest, introspection].compactMap {
                $0
            }
    }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String {
        var text = self
        while text.hasSuffix(suffix) { text.removeLast(suffix.count) }
        return text
    }
}
