import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import NIOHTTP1

/// Settings of a `refresh_url` account. The URL itself is a secret and lives in
/// `AccountSecrets.refreshURL`, never here.
public struct RefreshURLSettings: Codable, Sendable, Equatable {
    /// The HTTP method used to call the refresh URL.
    public enum Method: String, Codable, Sendable {
        case get = "GET"
        case post = "POST"
    }

    public var method: Method
}

extension RefreshURLSettings: ProviderSettings {
    package static let kind = "refresh_url"
    package static let storedName = "refreshURL"
    package static let fields = [ProviderField(name: "method", type: .text)]
    package static let renewal = Renewal.refreshes
    package static var refreshCredential: (name: String, secret: KeyPath<AccountSecrets, SecretBytes?>)? {
        ("refresh URL", \.refreshURL)
    }

    /// `GET` (the default) or `POST`, in any case.
    package init(checking fields: ProviderFields) throws(BrokerFailure) {
        guard let name = try fields.text("method") else {
            method = .get
            return
        }
        guard let parsed = Method(rawValue: name.uppercased()) else {
            throw .invalid("\"method\" of a refresh_url provider is GET or POST")
        }
        method = parsed
    }

    package func makeProvider(_ context: ProviderContext) -> any TokenProvider {
        RefreshURLProvider(settings: self, http: context.http, defaultLifetime: context.settings.defaultLifetime)
    }
}

/// `refresh_url` accounts (seed 000): the refresh credential is a one-time secret URL; calling
/// it yields an access token, its lifetime and the next refresh URL.
///
/// The URL is never named in a message or log line: it is "the refresh URL" everywhere.
package struct RefreshURLProvider: TokenProvider {
    package let settings: RefreshURLSettings
    package let http: IdPClient
    package let defaultLifetime: TimeInterval

    package func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        guard let text = record.secrets.refreshURL?.text, !text.isEmpty else {
            return .failure(.denial("no refresh URL; push one with brokerctl set-tokens (op set_tokens)"))
        }
        guard let url = URL(string: text), EndpointPolicy.isAllowed(url) else {
            return .failure(
                .denial(
                    "the refresh URL is not an https URL (plain http is allowed for loopback only); "
                        + "push a new one with brokerctl set-tokens (op set_tokens)"))
        }
        var headers = HTTPHeaders()
        headers.add(name: "Accept", value: "application/json")
        let method: HTTPMethod = settings.method == .post ? .POST : .GET
        // A POST carries an empty body (Content-Length: 0); a GET carries none.
        let body: String? = settings.method == .post ? "" : nil
        return await http.send(method: method, url: url, headers: headers, body: body, target: "the refresh URL")
            .flatMap { Self.interpret($0, from: url, now: now, defaultLifetime: defaultLifetime) }
    }

    /// HTTP statuses that mean the refresh URL is dead or was never valid.
    package static let denialStatuses: Set<Int> = [400, 401, 403, 404, 410]

    /// Classifies the answer of the refresh URL `current`: `{"access_token", "expires_in",
    /// "refresh_url"}` on success; a dead URL (400, 401, 403, 404, 410) is a denial, unless its
    /// body is an OAuth error by which the IdP says the failure is its own (`server_error`,
    /// `temporarily_unavailable`); everything else is transient. Messages quote an OAuth error
    /// the body has. A next URL on another origin than `current` (scheme, host, port) is
    /// refused as a denial: the credential never moves to a site it was not given for.
    package static func interpret(_ reply: IdPReply, from current: URL, now: Date, defaultLifetime: TimeInterval)
        -> Result<Grant, RefreshFailure>
    {
        let error = OAuthError(reply)
        let quoted = error?.quoted ?? ""
        switch reply.status {
        case 200..<300:
            guard let object = JSONValue.object(decoding: reply.body),
                let accessToken = object["access_token"]?.text, !accessToken.isEmpty
            else {
                return .failure(
                    .transient("the refresh URL answered HTTP \(reply.status) without a usable access_token\(quoted)"))
            }
            // A rotated URL that is present but not a string is a malformed answer, not "unchanged".
            let rotated = object["refresh_url"].flatMap { $0 == .null ? nil : $0 }
            if let rotated, rotated.text?.isEmpty != false {
                return .failure(.transient("the refresh URL answered with a malformed refresh_url"))
            }
            if let next = (rotated?.text).map({ URL(string: $0) }) {
                guard let next, EndpointPolicy.isAllowed(next, handedOverBy: current), Origin(next) == Origin(current)
                else {
                    return .failure(
                        .denial(
                            "the refresh URL handed over a next refresh URL on another origin (scheme, host or port) "
                                + "or not https; it was not followed. Push a new refresh URL with brokerctl set-tokens "
                                + "(op set_tokens)"))
                }
            }
            return AccessToken.issued(accessToken, in: object, now: now, defaultLifetime: defaultLifetime)
                .flatMap { token in
                    SecretBytes.fromAnswer(rotated?.text).map { Grant(token: token, refreshURL: $0) }
                }
        case let status where denialStatuses.contains(status) && error?.isServerError != true:
            return .failure(
                .denial(
                    "the refresh URL was refused: HTTP \(status)\(quoted); push a new one with brokerctl set-tokens "
                        + "(op set_tokens)"))
        default:
            return .failure(
                .transient("the refresh URL answered HTTP \(reply.status)\(quoted)", retryAfter: reply.retryAfter))
        }
    }
}
