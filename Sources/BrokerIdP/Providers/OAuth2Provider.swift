import AsyncHTTPClient
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import NIOCore
import NIOHTTP1

/// Settings of an `oauth2` account (RFC 6749 section 6 refresh grant).
public struct OAuth2Settings: Codable, Sendable, Equatable {
    /// How the client authenticates at the token endpoint.
    public enum ClientAuth: String, Codable, Sendable {
        case clientSecretBasic = "client_secret_basic"
        case clientSecretPost = "client_secret_post"
        case none
    }

    /// Where refresh grants go; `nil` when it is discovered from `issuer`.
    public var tokenEndpoint: URL?
    public var clientID: String
    public var clientAuth: ClientAuth
    public var scope: String?
    /// An OIDC issuer whose discovery document names the token endpoint (used when
    /// `tokenEndpoint` is `nil`).
    public var issuer: URL? = nil
    /// Where `logout` revokes the refresh token (RFC 7009); discovered from `issuer` when `nil`.
    public var revocationEndpoint: URL? = nil
    /// Where `login --flow browser` sends the user (RFC 6749 section 3.1); discovered from
    /// `issuer` when `nil`.
    public var authorizationEndpoint: URL? = nil
    /// Where `login --flow device` asks for a user code (RFC 8628 section 3.1); discovered from
    /// `issuer` when `nil`.
    public var deviceAuthorizationEndpoint: URL? = nil
    /// The DPoP algorithm (RFC 9449) the account's tokens are bound with, `ES256`; `nil`: bearer
    /// tokens. The key is made by the broker (`DPoPKey`).
    public var dpop: String? = nil
    /// URLs on the origins of the IdP's endpoints that programs may have DPoP proofs made for
    /// (a userinfo endpoint), in normal form (`NormalizedURL`); every other URL there is refused
    /// (docs/dpop.md, "No proof for the IdP's doors").
    public var dpopAllow: [String]? = nil
}

extension OAuth2Settings: ProviderSettings {
    package static let kind = "oauth2"
    package static let fields = [
        ProviderField(name: "token_endpoint", type: .text), ProviderField(name: "issuer", type: .text),
        ProviderField(name: "client_id", type: .text), .clientSecret, ProviderField(name: "client_auth", type: .text),
        ProviderField(name: "scope", type: .text), ProviderField(name: "revocation_endpoint", type: .text),
        ProviderField(name: "authorization_endpoint", type: .text),
        ProviderField(name: "device_authorization_endpoint", type: .text), ProviderField(name: "dpop", type: .text),
        ProviderField(name: "dpop_allow", type: .texts),
    ]
    package static let renewal = Renewal.refreshes
    package static var refreshCredential: (name: String, secret: KeyPath<AccountSecrets, SecretBytes?>)? {
        ("refresh token", \.refreshToken)
    }

    /// A token endpoint, or an OIDC issuer to discover it from; a client id; client
    /// authentication that has the secret it needs.
    package init(checking fields: ProviderFields) throws(BrokerFailure) {
        switch (try fields.text("token_endpoint"), try fields.text("issuer")) {
        case (let text?, nil):
            tokenEndpoint = try EndpointPolicy.checkedURL(text, field: "token_endpoint")
            issuer = nil
        case (nil, let text?):
            let url = try EndpointPolicy.checkedURL(text, field: "issuer")
            guard url.query == nil, url.fragment == nil else {
                throw .invalid("\"issuer\" must not have a query or fragment (OIDC Discovery)")
            }
            tokenEndpoint = nil
            issuer = url
        case (_?, _?):
            throw .invalid("give an oauth2 provider \"token_endpoint\" or \"issuer\", not both")
        case (nil, nil):
            throw .invalid("an oauth2 provider needs \"token_endpoint\" or \"issuer\"")
        }
        guard let clientID = try fields.text("client_id"), !clientID.isEmpty else {
            throw .invalid("an oauth2 provider needs \"client_id\"")
        }
        self.clientID = clientID
        let hasSecret = try fields.text(ProviderField.clientSecret.name) != nil || fields.holdsClientSecret
        if let name = try fields.text("client_auth") {
            guard let parsed = ClientAuth(rawValue: name) else {
                throw .invalid("\"client_auth\" is one of client_secret_basic, client_secret_post, none")
            }
            clientAuth = parsed
        } else {
            clientAuth = hasSecret ? .clientSecretBasic : .none
        }
        if clientAuth != .none, !hasSecret {
            throw .invalid("client_auth \(clientAuth.rawValue) needs \"client_secret\"")
        }
        scope = try fields.text("scope")
        revocationEndpoint = try Self.endpoint("revocation_endpoint", in: fields)
        authorizationEndpoint = try Self.endpoint("authorization_endpoint", in: fields)
        deviceAuthorizationEndpoint = try Self.endpoint("device_authorization_endpoint", in: fields)
        dpop = try fields.text("dpop")
        if let dpop, dpop != DPoPKey.algorithm {
            throw .invalid("\"dpop\" is \"\(DPoPKey.algorithm)\", the algorithm every DPoP IdP accepts")
        }
        dpopAllow = try Self.checkedDPoPAllow(in: fields)
    }

    /// The most URLs `dpop_allow` takes.
    package static let dpopAllowLimit = 64

    /// `dpop_allow` in normal form: URLs a proof could be made for, without query or fragment.
    private static func checkedDPoPAllow(in fields: ProviderFields) throws(BrokerFailure) -> [String]? {
        guard let texts = try fields.texts("dpop_allow") else { return nil }
        guard texts.count <= dpopAllowLimit else {
            throw .invalid("\"dpop_allow\" lists at most \(dpopAllowLimit) URLs")
        }
        return try texts.map { text throws(BrokerFailure) in
            guard !text.contains("?"), !text.contains("#"),
                let target = try? DPoPTarget(method: "GET", url: text, nonce: nil)
            else {
                throw .invalid(
                    "\"dpop_allow\" lists URLs as a proof's htu: https (http only for loopback), without query or fragment"
                )
            }
            return target.url
        }
    }

    /// The optional endpoint URL of `field`, checked like the token endpoint.
    private static func endpoint(_ field: String, in fields: ProviderFields) throws(BrokerFailure) -> URL? {
        try fields.text(field).map { text throws(BrokerFailure) in try EndpointPolicy.checkedURL(text, field: field) }
    }

    package func makeProvider(_ context: ProviderContext) -> any TokenProvider {
        OAuth2Provider(settings: self, http: context.http, defaultLifetime: context.settings.defaultLifetime)
    }

    /// The device authorization endpoint is sent the client secret; the authorization endpoint
    /// only the user's browser, with no secret.
    package var credentialURLs: [URL?] { [tokenEndpoint ?? issuer, revocationEndpoint, deviceAuthorizationEndpoint] }

    /// A credential belongs to its client, and an issuer is kept whole, not just its origin:
    /// its discovery document, wherever it names, decides where the credential goes.
    package func credentialMove(to new: OAuth2Settings) -> String? {
        if clientID != new.clientID { return "changes its client_id" }
        if issuer != new.issuer { return "changes its issuer (or switches issuer and token_endpoint)" }
        return nil
    }

    /// A token endpoint given replaces the issuer, and an issuer the token endpoint.
    package func fieldValues(changedBy changes: [String: JSONValue]) -> [String: JSONValue]? {
        let urls: [(String, URL?)] = [
            ("token_endpoint", tokenEndpoint), ("issuer", issuer), ("revocation_endpoint", revocationEndpoint),
            ("authorization_endpoint", authorizationEndpoint),
            ("device_authorization_endpoint", deviceAuthorizationEndpoint),
        ]
        var values: [String: JSONValue] = ["client_id": .string(clientID), "client_auth": .string(clientAuth.rawValue)]
        for (name, url) in urls { if let url { values[name] = .string(url.absoluteString) } }
        if let scope { values["scope"] = .string(scope) }
        if let dpop { values["dpop"] = .string(dpop) }
        if let dpopAllow { values["dpop_allow"] = .array(dpopAllow.map(JSONValue.string)) }
        if changes["token_endpoint"] != nil { values["issuer"] = nil }
        if changes["issuer"] != nil { values["token_endpoint"] = nil }
        for (name, value) in changes { values[name] = value == .null ? nil : value }
        return values
    }
}

extension OAuth2Settings {
    /// Adds the client authentication of `clientAuth` to a form (RFC 6749 section 2.3.1) and
    /// returns the request headers.
    package func authenticate(_ form: inout [(String, String)], secret: String?) -> HTTPHeaders {
        var headers = HTTPHeaders()
        switch clientAuth {
        case .clientSecretBasic:
            let user = FormEncoding.escape(clientID)
            let password = FormEncoding.escape(secret ?? "")
            headers.add(name: "Authorization", value: "Basic " + Data("\(user):\(password)".utf8).base64EncodedString())
        case .clientSecretPost:
            form.append(("client_id", clientID))
            form.append(("client_secret", secret ?? ""))
        case .none:
            form.append(("client_id", clientID))
        }
        headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        headers.add(name: "Accept", value: "application/json")
        return headers
    }

    /// The configured token endpoint, or the one the issuer's discovery document names.
    package func tokenEndpoint(http: IdPClient) async -> Result<URL, RefreshFailure> {
        if let tokenEndpoint { return .success(tokenEndpoint) }
        guard let issuer else {
            return .failure(.denial("the account has neither a token endpoint nor an issuer; add it again"))
        }
        return await http.discovery.tokenEndpoint(issuer: issuer, http: http)
    }
}

/// `oauth2` accounts: the RFC 6749 section 6 refresh grant against a token endpoint, given
/// directly or discovered from an OIDC issuer.
package struct OAuth2Provider: NarrowingTokenProvider {
    package let settings: OAuth2Settings
    package let http: IdPClient
    package let defaultLifetime: TimeInterval

    package func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        await post(refreshing: record, scope: settings.scope, resource: nil, now: now).flatMap {
            Self.interpret($0, now: now, defaultLifetime: defaultLifetime)
        }
    }

    /// The refresh grant of `record` (RFC 6749 section 6) with `scope` and `resource` (RFC 8707),
    /// with a DPoP proof made at `now` when the account has a key.
    private func post(refreshing record: AccountRecord, scope: String?, resource: String?, now: Date) async -> Result<
        IdPReply, RefreshFailure
    > {
        guard let refreshToken = record.secrets.refreshToken else {
            return .failure(.denial("no refresh token; push one with brokerctl set-tokens (op set_tokens)"))
        }
        var form = [("grant_type", "refresh_token"), ("refresh_token", refreshToken.text)]
        if let scope { form.append(("scope", scope)) }
        if let resource { form.append(("resource", resource)) }
        let headers = settings.authenticate(&form, secret: record.secrets.clientSecret?.text)

        let endpoint: URL
        switch await settings.tokenEndpoint(http: http) {
        case .success(let value): endpoint = value
        case .failure(let failure): return .failure(failure)
        }
        // Each proof is made as it is sent: `now` plus the time spent since (discovery, a nonce).
        let started = ContinuousClock.now
        let proof = record.dpopKey.map { key in
            (
                key: key,
                at: { @Sendable in
                    let elapsed = (ContinuousClock.now - started).components
                    return now.addingTimeInterval(Double(elapsed.seconds) + Double(elapsed.attoseconds) / 1e18)
                }
            )
        }
        return await http.post(endpoint, headers: headers, body: FormEncoding.encode(form), proof: proof)
    }

    /// The refresh grant narrowed to `key`: its scopes (the configured scope when it names
    /// none) and its resource. The token's `scope` is what the IdP granted, or what was asked.
    package func refresh(_ record: AccountRecord, for key: TokenKey, now: Date) async -> Result<Grant, RefreshFailure> {
        let scope = key.scopeText ?? settings.scope
        return await post(refreshing: record, scope: scope, resource: key.resource, now: now).flatMap { reply in
            if let refusal = Self.targetRefusal(reply) { return .failure(refusal) }
            return Self.interpret(reply, now: now, defaultLifetime: defaultLifetime).map { grant in
                var grant = grant
                if grant.token.scope == nil { grant.token.scope = scope }
                return grant
            }
        }
    }

    /// The IdP's refusal of the scope or resource asked for (RFC 6749 section 5.2
    /// `invalid_scope`, RFC 8707 section 2 `invalid_target`), with its description.
    package static func targetRefusal(_ reply: IdPReply) -> RefreshFailure? {
        guard reply.status == 400, let error = OAuthError(reply),
            ["invalid_scope", "invalid_target"].contains(error.code)
        else { return nil }
        return RefreshFailure(kind: .targetRefused, message: error.text, retryAfter: nil)
    }

    /// Revokes the refresh token (or, without one, the access token) at the revocation endpoint
    /// (RFC 7009), configured or discovered. Without an endpoint there is nothing to call.
    package func revoke(_ record: AccountRecord) async -> Result<Revocation, RefreshFailure> {
        let credential: (token: String, hint: String)
        if let refreshToken = record.secrets.refreshToken {
            credential = (refreshToken.text, "refresh_token")
        } else if let accessToken = record.token?.value {
            credential = (accessToken.text, "access_token")
        } else {
            return .success(.unsupported)
        }
        var endpoint = settings.revocationEndpoint
        if endpoint == nil, let issuer = settings.issuer {
            switch await http.discovery.endpoints(issuer: issuer, http: http) {
            case .success(let discovered): endpoint = discovered.revocation
            case .failure(let failure): return .failure(failure)
            }
        }
        guard let endpoint else { return .success(.unsupported) }
        var form = [("token", credential.token), ("token_type_hint", credential.hint)]
        let headers = settings.authenticate(&form, secret: record.secrets.clientSecret?.text)
        return await http.post(endpoint, headers: headers, body: FormEncoding.encode(form)).flatMap(
            Self.interpretRevocation)
    }

    /// Classifies a revocation endpoint's answer (RFC 7009 section 2.2). Only 2xx is a
    /// revocation (an already-invalid token is answered 200 too); `unsupported_token_type` means
    /// the IdP does not revoke this kind of token. 5xx and 429 are transient; any other answer
    /// (wrong client credentials, a wrong endpoint URL) leaves the credential alive: a denial.
    package static func interpretRevocation(_ reply: IdPReply) -> Result<Revocation, RefreshFailure> {
        let error = OAuthError(reply)
        switch reply.status {
        case 200..<300:
            return .success(.revoked)
        case 400 where error?.code == "unsupported_token_type":
            return .success(.unsupported)
        case 429, 500...:
            return .failure(
                .transient("the revocation endpoint answered HTTP \(reply.status)", retryAfter: reply.retryAfter))
        default:
            return .failure(.denial("the revocation endpoint refused: HTTP \(reply.status)\(error?.quoted ?? "")"))
        }
    }

    /// Whether a refusal, as `interpret` or a login words it (`OAuthError.quoted`), names a
    /// client error (`OAuthError.clientErrors`). It reads the message because a denial's
    /// message is what the vault keeps of it.
    package static func rejectsClient(_ message: String) -> Bool {
        OAuthError.code(quotedIn: message).map { OAuthError.clientErrors.contains(String($0)) } ?? false
    }

    /// Classifies a token endpoint's answer (RFC 6749 sections 5.1 and 5.2): only a 400 or 401
    /// whose `error` refuses the grant or the client (`OAuthError.denials`) is a denial; every
    /// other answer, an unreadable one included, is transient. Messages quote the IdP's `error`
    /// and `error_description`.
    package static func interpret(_ reply: IdPReply, now: Date, defaultLifetime: TimeInterval) -> Result<
        Grant, RefreshFailure
    > {
        let object = JSONValue.object(decoding: reply.body)
        let error = object.flatMap(OAuthError.init)
        let quoted = error?.quoted ?? ""
        switch reply.status {
        case 200..<300:
            guard let object, let accessToken = object["access_token"]?.text, !accessToken.isEmpty else {
                return .failure(
                    .transient(
                        "the token endpoint answered HTTP \(reply.status) without a usable access_token\(quoted)"))
            }
            return AccessToken.issued(accessToken, in: object, now: now, defaultLifetime: defaultLifetime)
                .flatMap { token in
                    LifetimeField.read(object, "refresh_expires_in").flatMap { refreshLifetime in
                        SecretBytes.fromAnswer(object["refresh_token"]?.text).map { refreshToken in
                            Grant(
                                token: token, refreshToken: refreshToken,
                                refreshExpiresAt: refreshLifetime.map { now.addingTimeInterval($0) })
                        }
                    }
                }
        case _ where reply.dpopError != nil:
            // A nonce asked for again after the retry, or a proof refused (a clock the IdP finds
            // skewed): neither says anything of the credential, so the account is not sent to
            // `needs_login`; the next attempt makes a new proof with the newest nonce.
            return .failure(.transient("the token endpoint refused the DPoP proof (\(reply.dpopError ?? ""))"))
        case 400...401 where error?.isDenial == true:
            return .failure(.denial("the token endpoint refused the refresh: HTTP \(reply.status)\(quoted)"))
        default:
            return .failure(
                .transient("the token endpoint answered HTTP \(reply.status)\(quoted)", retryAfter: reply.retryAfter))
        }
    }
}
