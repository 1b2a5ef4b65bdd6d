import AsyncHTTPClient
import BrokerProtocol
import FoundationEssentials
import NIOCore
import NIOHTTP1

/// `oauth2` accounts: the RFC 6749 section 6 refresh grant against a token endpoint, given
/// directly or discovered from an OIDC issuer.
struct OAuth2Provider: TokenProvider {
    let settings: OAuth2Settings
    let http: IdPClient
    let defaultLifetime: TimeInterval

    func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        guard let refreshToken = record.secrets.refreshToken else {
            return .failure(.denial("no refresh token; push one with set_tokens"))
        }
        var form = [("grant_type", "refresh_token"), ("refresh_token", refreshToken)]
        if let scope = settings.scope { form.append(("scope", scope)) }
        let headers = authenticate(&form, secret: record.secrets.clientSecret)

        let endpoint: URL
        switch await tokenEndpoint() {
        case .success(let value): endpoint = value
        case .failure(let failure): return .failure(failure)
        }
        return await http.post(endpoint, headers: headers, body: FormEncoding.encode(form))
            .flatMap { Self.interpret($0, now: now, defaultLifetime: defaultLifetime) }
    }

    /// Revokes the refresh token (or, without one, the access token) at the revocation endpoint
    /// (RFC 7009), configured or discovered. Without an endpoint there is nothing to call.
    func revoke(_ record: AccountRecord) async -> Result<Revocation, RefreshFailure> {
        let credential: (token: String, hint: String)
        if let refreshToken = record.secrets.refreshToken {
            credential = (refreshToken, "refresh_token")
        } else if let accessToken = record.token?.value {
            credential = (accessToken, "access_token")
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
        let headers = authenticate(&form, secret: record.secrets.clientSecret)
        return await http.post(endpoint, headers: headers, body: FormEncoding.encode(form)).flatMap(
            Self.interpretRevocation)
    }

    /// Classifies a revocation endpoint's answer (RFC 7009 section 2.2). Only 2xx is a
    /// revocation (an already-invalid token is answered 200 too); `unsupported_token_type` means
    /// the IdP does not revoke this kind of token. 5xx and 429 are transient; any other answer
    /// (wrong client credentials, a wrong endpoint URL) leaves the credential alive: a denial.
    static func interpretRevocation(_ reply: IdPReply) -> Result<Revocation, RefreshFailure> {
        let object = UntypedJSON.object(reply.body)
        let code = object?["error"] as? String
        switch reply.status {
        case 200..<300:
            return .success(.revoked)
        case 400 where code == "unsupported_token_type":
            return .success(.unsupported)
        case 429, 500...:
            return .failure(
                .transient("the revocation endpoint answered HTTP \(reply.status)", retryAfter: reply.retryAfter))
        default:
            let detail = code.map { " (\($0))" } ?? ""
            return .failure(.denial("the revocation endpoint refused: HTTP \(reply.status)\(detail)"))
        }
    }

    /// Adds the client authentication of `settings.clientAuth` to a form (RFC 6749 section
    /// 2.3.1) and returns the request headers.
    private func authenticate(_ form: inout [(String, String)], secret: String?) -> HTTPHeaders {
        var headers = HTTPHeaders()
        switch settings.clientAuth {
        case .clientSecretBasic:
            let user = FormEncoding.escape(settings.clientID)
            let password = FormEncoding.escape(secret ?? "")
            headers.add(name: "Authorization", value: "Basic " + Data("\(user):\(password)".utf8).base64EncodedString())
        case .clientSecretPost:
            form.append(("client_id", settings.clientID))
            form.append(("client_secret", secret ?? ""))
        case .none:
            form.append(("client_id", settings.clientID))
        }
        headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        headers.add(name: "Accept", value: "application/json")
        return headers
    }

    /// The configured token endpoint, or the one the issuer's discovery document names.
    private func tokenEndpoint() async -> Result<URL, RefreshFailure> {
        if let endpoint = settings.tokenEndpoint { return .success(endpoint) }
        guard let issuer = settings.issuer else {
            return .failure(.denial("the account has neither a token endpoint nor an issuer; add it again"))
        }
        return await http.discovery.tokenEndpoint(issuer: issuer, http: http)
    }

    /// Classifies a token endpoint's answer (RFC 6749 sections 5.1 and 5.2).
    static func interpret(_ reply: IdPReply, now: Date, defaultLifetime: TimeInterval) -> Result<Grant, RefreshFailure>
    {
        let object = UntypedJSON.object(reply.body)
        switch reply.status {
        case 200..<300:
            guard let object, let accessToken = object["access_token"] as? String, !accessToken.isEmpty else {
                return .failure(.transient("the token endpoint answered \(reply.status) without a usable access_token"))
            }
            return AccessToken.issued(accessToken, in: object, now: now, defaultLifetime: defaultLifetime)
                .flatMap { token in
                    LifetimeField.read(object, "refresh_expires_in").map { refreshLifetime in
                        Grant(
                            token: token, refreshToken: object["refresh_token"] as? String,
                            refreshExpiresAt: refreshLifetime.map { now.addingTimeInterval($0) })
                    }
                }
        case 400, 401:
            let code = (object?["error"] as? String).map { " (\($0))" } ?? ""
            return .failure(.denial("the token endpoint refused the refresh: HTTP \(reply.status)\(code)"))
        default:
            return .failure(
                .transient("the token endpoint answered HTTP \(reply.status)", retryAfter: reply.retryAfter))
        }
    }
}

/// `application/x-www-form-urlencoded` bodies (RFC 6749 appendix B).
enum FormEncoding {
    private static let unreserved = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~".utf8)

    /// `text` with every UTF-8 byte outside the unreserved characters written `%XX`.
    static func escape(_ text: String) -> String {
        let hex = Array("0123456789ABCDEF".utf8)
        var escaped: [UInt8] = []
        escaped.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            if unreserved.contains(byte) {
                escaped.append(byte)
            } else {
                escaped += [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
            }
        }
        return String(decoding: escaped, as: UTF8.self)
    }

    static func encode(_ pairs: [(String, String)]) -> String {
        pairs.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }

    /// A short, printable form of a value a client sent, for an error message. (Text from an
    /// IdP is cleaned by the broker instead, which also redacts the account's secrets.)
    static func printable(_ text: String) -> String {
        String(
            text.unicodeScalars.filter { $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F }.prefix(64).map(
                Character.init))
    }
}
