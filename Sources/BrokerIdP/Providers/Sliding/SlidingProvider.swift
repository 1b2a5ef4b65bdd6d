import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import NIOHTTP1

/// Settings of a `sliding` account.
public struct SlidingSettings: Codable, Sendable, Equatable {
    /// The refresh endpoint, called with `POST` and `Authorization: Bearer <refresh token>`.
    public var endpoint: URL
    /// IANA time zone in which timestamps without a zone are read (`UTC` by default).
    public var timeZone: String
}

extension SlidingSettings: ProviderSettings {
    package static let kind = "sliding"
    package static let fields = [
        ProviderField(name: "endpoint", type: .text), ProviderField(name: "timezone", type: .text),
    ]
    package static let renewal = Renewal.refreshes
    package static var refreshCredential: (name: String, secret: KeyPath<AccountSecrets, SecretBytes?>)? {
        ("refresh token", \.refreshToken)
    }

    /// An endpoint the broker will call, and an IANA zone (`UTC` by default).
    package init(checking fields: ProviderFields) throws(BrokerFailure) {
        guard let endpoint = try fields.text("endpoint") else {
            throw .invalid("a sliding provider needs \"endpoint\"")
        }
        self.endpoint = try EndpointPolicy.checkedURL(endpoint, field: "endpoint")
        let zone = try fields.text("timezone") ?? "UTC"
        guard !zone.isEmpty, IANATimeZone(identifier: zone) != nil else {
            throw .invalid(
                "\"timezone\" must be an IANA time zone name such as UTC or Europe/Berlin, not "
                    + "\"\(InputEcho.printable(zone))\"")
        }
        timeZone = zone
    }

    package func makeProvider(_ context: ProviderContext) -> any TokenProvider {
        SlidingProvider(settings: self, http: context.http, defaultLifetime: context.settings.defaultLifetime)
    }

    package var credentialURLs: [URL?] { [endpoint] }
}

/// `sliding` accounts (seed 004): one-time refresh tokens with a sliding expiry. Every refresh
/// returns a new refresh token (the old one is dead) in the envelope
/// `{status, message, data{accessToken, refreshToken, accessTokenExpiresAt, refreshTokenExpiresAt}}`.
/// The refresh token's expiry reaches the broker's planner, which refreshes before it lapses.
package struct SlidingProvider: TokenProvider {
    package let settings: SlidingSettings
    package let http: IdPClient
    package let defaultLifetime: TimeInterval
    /// The settings' zone, read from the time-zone database once, when the provider is built
    /// (again after a reload), not on every refresh.
    package let zone: IANATimeZone

    package init(settings: SlidingSettings, http: IdPClient, defaultLifetime: TimeInterval) {
        self.settings = settings
        self.http = http
        self.defaultLifetime = defaultLifetime
        zone = IANATimeZone(identifier: settings.timeZone) ?? .utc
    }

    package func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        guard let refreshToken = record.secrets.refreshToken?.text, !refreshToken.isEmpty else {
            return .failure(.denial("no refresh token; push one with brokerctl set-tokens (op set_tokens)"))
        }
        // Checked here so the HTTP layer never reports the header (and the token in it) as invalid.
        guard refreshToken.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7F }) else {
            return .failure(
                .denial(
                    "the refresh token cannot be sent in an HTTP header; push a new one with brokerctl set-tokens "
                        + "(op set_tokens)"))
        }
        var headers = HTTPHeaders()
        headers.add(name: "Authorization", value: "Bearer \(refreshToken)")
        headers.add(name: "Accept", value: "application/json")
        return await http.send(method: .POST, url: settings.endpoint, headers: headers, body: "")
            .flatMap { Self.interpret($0, now: now, timeZone: zone, defaultLifetime: defaultLifetime) }
    }

    /// Classifies the endpoint's answer. `status: false` (e.g. `RefreshTokenMismatch`) and HTTP
    /// 401 (the bearer refresh token refused) are denials, unless the body is an OAuth error by
    /// which the IdP says the failure is its own (`server_error`, `temporarily_unavailable`);
    /// 5xx, 429, other statuses (a 400 without `status: false` too) and malformed bodies are
    /// transient.
    package static func interpret(_ reply: IdPReply, now: Date, timeZone: IANATimeZone, defaultLifetime: TimeInterval)
        -> Result<Grant, RefreshFailure>
    {
        let object = JSONValue.object(decoding: reply.body)
        let reason = (object?["message"]?.text).map { ": " + $0 } ?? ""
        let serverError = object.flatMap(OAuthError.init).flatMap { $0.isServerError ? $0 : nil }
        switch reply.status {
        case 500..<600, 429:
            return .failure(
                .transient("the sliding endpoint answered HTTP \(reply.status)", retryAfter: reply.retryAfter))
        case _ where serverError != nil:
            return .failure(
                .transient(
                    "the sliding endpoint answered HTTP \(reply.status)\(serverError?.quoted ?? "")",
                    retryAfter: reply.retryAfter))
        case 401:
            return .failure(.denial("the sliding endpoint refused the refresh: HTTP \(reply.status)\(reason)"))
        default:
            break
        }
        guard let object, let status = object["status"]?.bool else {
            return .failure(
                .transient("the sliding endpoint answered HTTP \(reply.status) without a {status, data} envelope"))
        }
        guard status else {
            return .failure(
                .denial("the sliding endpoint refused the refresh\(reason.isEmpty ? ": status false" : reason)"))
        }
        guard (200..<300).contains(reply.status) else {
            return .failure(
                .transient("the sliding endpoint answered HTTP \(reply.status)", retryAfter: reply.retryAfter))
        }
        guard let data = object["data"]?.object, let accessToken = data["accessToken"]?.text,
            !accessToken.isEmpty
        else {
            return .failure(.transient("the sliding endpoint answered status true without a usable accessToken"))
        }
        let expiresAt: Date?
        let refreshExpiresAt: Date?
        switch (
            timestamp(data, "accessTokenExpiresAt", zone: timeZone),
            timestamp(data, "refreshTokenExpiresAt", zone: timeZone)
        ) {
        case (.success(let access), .success(let refresh)): (expiresAt, refreshExpiresAt) = (access, refresh)
        case (.failure(let failure), _), (_, .failure(let failure)): return .failure(failure)
        }
        let rotated = (data["refreshToken"]?.text).flatMap { $0.isEmpty ? nil : $0 }
        return SecretBytes.fromAnswer(rotated).flatMap { rotated in
            SecretBytes.fromAnswer(accessToken).flatMap { value in
                AccessToken(
                    value: value, type: data["tokenType"]?.text ?? "Bearer",
                    expiresAt: Bounds.date(expiresAt ?? now.addingTimeInterval(defaultLifetime)), obtainedAt: now
                ).checked().map {
                    Grant(token: $0, refreshToken: rotated, refreshExpiresAt: refreshExpiresAt.map { Bounds.date($0) })
                }
            }
        }
    }

    /// An optional timestamp field of the envelope's `data`: absent or null is `nil`; anything
    /// but a readable string is a malformed (transient) answer.
    private static func timestamp(_ data: [String: JSONValue], _ field: String, zone: IANATimeZone) -> Result<
        Date?, RefreshFailure
    > {
        switch data[field] {
        case nil, .null?: return .success(nil)
        case .string(let text)?:
            if let parsed = Timestamp.parse(text, defaultZone: zone) { return .success(parsed) }
        default: break
        }
        return .failure(.transient("the sliding endpoint sent an unreadable \(field)"))
    }
}
