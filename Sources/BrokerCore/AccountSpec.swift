import BrokerProtocol
import FoundationEssentials

/// Turns the wire's `provider` and `tokens` objects into validated account data.
enum AccountSpec {
    /// Account names: 1 to 128 characters from `A-Z a-z 0-9 . _ - @`.
    static func validateName(_ name: String?) throws(BrokerError) -> String {
        guard let name, !name.isEmpty else { throw BrokerError(.badRequest, "the field \"account\" is required") }
        let allowed = name.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == 0x2E || byte == 0x5F || byte == 0x2D || byte == 0x40
        }
        guard allowed, name.utf8.count <= 128 else {
            throw BrokerError(.badRequest, "account names are 1-128 characters of A-Z a-z 0-9 . _ - @")
        }
        return name
    }

    /// Validates a provider object; returns its settings and the client secret it carried.
    static func provider(_ spec: ProviderSpec?) throws(BrokerError) -> (ProviderConfig, clientSecret: String?) {
        guard let spec else { throw BrokerError(.badRequest, "the field \"provider\" is required") }
        switch spec.kind {
        case "static":
            return (.static, nil)
        case "oauth2":
            return try oauth2(spec)
        case "refresh_url":
            let method: RefreshURLSettings.Method
            if let name = spec.method {
                guard let parsed = RefreshURLSettings.Method(rawValue: name.uppercased()) else {
                    throw BrokerError(.badRequest, "\"method\" of a refresh_url provider is GET or POST")
                }
                method = parsed
            } else {
                method = .get
            }
            return (.refreshURL(RefreshURLSettings(method: method)), nil)
        case "sliding":
            guard let endpoint = spec.endpoint else {
                throw BrokerError(.badRequest, "a sliding provider needs \"endpoint\"")
            }
            let url = try allowedURL(endpoint, field: "endpoint")
            let zone = spec.timezone ?? "UTC"
            guard !zone.isEmpty, IANATimeZone(identifier: zone) != nil else {
                throw BrokerError(
                    .badRequest,
                    "\"timezone\" must be an IANA time zone name such as UTC or Europe/Berlin, not "
                        + "\"\(FormEncoding.printable(zone))\"")
            }
            return (.sliding(SlidingSettings(endpoint: url, timeZone: zone)), nil)
        case "exec":
            guard let command = spec.command, let path = command.first else {
                throw BrokerError(.badRequest, "an exec provider needs \"command\", a non-empty array of strings")
            }
            guard !command.contains(where: { $0.utf8.contains(0) }) else {
                throw BrokerError(.badRequest, "\"command\" arguments must not contain NUL characters")
            }
            guard path.hasPrefix("/") else {
                throw BrokerError(.badRequest, "command[0] must be an absolute path (the command runs without a shell)")
            }
            var isDirectory = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory,
                FileManager.default.isExecutableFile(atPath: path)
            else {
                throw BrokerError(.badRequest, "command[0] \(FormEncoding.printable(path)) is not an executable file")
            }
            return (.exec(ExecSettings(command: command)), nil)
        default:
            throw BrokerError(
                .badRequest,
                "unknown provider kind \"\(FormEncoding.printable(spec.kind))\"; use oauth2, refresh_url, sliding, "
                    + "exec or static")
        }
    }

    /// An `oauth2` provider: a token endpoint, or an OIDC issuer to discover it from.
    private static func oauth2(_ spec: ProviderSpec) throws(BrokerError) -> (ProviderConfig, clientSecret: String?) {
        let endpoint: URL?
        let issuer: URL?
        switch (spec.tokenEndpoint, spec.issuer) {
        case (let text?, nil):
            endpoint = try allowedURL(text, field: "token_endpoint")
            issuer = nil
        case (nil, let text?):
            let url = try allowedURL(text, field: "issuer")
            guard url.query == nil, url.fragment == nil else {
                throw BrokerError(.badRequest, "\"issuer\" must not have a query or fragment (OIDC Discovery)")
            }
            endpoint = nil
            issuer = url
        case (_?, _?):
            throw BrokerError(.badRequest, "give an oauth2 provider \"token_endpoint\" or \"issuer\", not both")
        case (nil, nil):
            throw BrokerError(.badRequest, "an oauth2 provider needs \"token_endpoint\" or \"issuer\"")
        }
        guard let clientID = spec.clientID, !clientID.isEmpty else {
            throw BrokerError(.badRequest, "an oauth2 provider needs \"client_id\"")
        }
        let auth: OAuth2Settings.ClientAuth
        if let name = spec.clientAuth {
            guard let parsed = OAuth2Settings.ClientAuth(rawValue: name) else {
                throw BrokerError(
                    .badRequest, "\"client_auth\" is one of client_secret_basic, client_secret_post, none")
            }
            auth = parsed
        } else {
            auth = spec.clientSecret == nil ? .none : .clientSecretBasic
        }
        if auth != .none, spec.clientSecret == nil {
            throw BrokerError(.badRequest, "client_auth \(auth.rawValue) needs \"client_secret\"")
        }
        var revocation: URL?
        if let text = spec.revocationEndpoint { revocation = try allowedURL(text, field: "revocation_endpoint") }
        let settings = OAuth2Settings(
            tokenEndpoint: endpoint, clientID: clientID, clientAuth: auth, scope: spec.scope, issuer: issuer,
            revocationEndpoint: revocation)
        return (.oauth2(settings), spec.clientSecret)
    }

    /// An IdP URL from the provider object: https, or http to a loopback host.
    private static func allowedURL(_ text: String, field: String) throws(BrokerError) -> URL {
        guard let url = URL(string: text), EndpointPolicy.isAllowed(url) else {
            throw BrokerError(.badRequest, "\"\(field)\" must be an https URL (http only for loopback)")
        }
        return url
    }

    /// The access token a `tokens` object carries, if any.
    static func accessToken(_ tokens: TokenSet, now: Date, defaultLifetime: TimeInterval) throws(BrokerError)
        -> AccessToken?
    {
        guard let value = tokens.accessToken else { return nil }
        guard !value.isEmpty else { throw BrokerError(.badRequest, "\"access_token\" is empty") }
        let lifetime = try tokens.expiresIn.map { seconds throws(BrokerError) in
            try pushedLifetime(seconds, "expires_in")
        }
        let expiresAt = Bounds.date(tokens.expiresAt ?? now.addingTimeInterval(lifetime ?? defaultLifetime))
        let token = AccessToken(
            value: value, type: tokens.tokenType ?? "Bearer", expiresAt: expiresAt, obtainedAt: now,
            idToken: tokens.idToken, scope: tokens.scope, pushed: true)
        if let field = token.unsafeField {
            throw BrokerError(.badRequest, "\"\(field)\" must be printable ASCII (it goes into HTTP headers)")
        }
        return token
    }

    /// The refresh token's expiry a `tokens` object states, if any.
    static func refreshExpiry(_ tokens: TokenSet, now: Date) throws(BrokerError) -> Date? {
        if let date = tokens.refreshExpiresAt { return Bounds.date(date) }
        guard let seconds = tokens.refreshExpiresIn else { return nil }
        return now.addingTimeInterval(try pushedLifetime(seconds, "refresh_expires_in"))
    }

    /// A lifetime a person pushed: finite, cut to ±`Bounds.maximumLifetime` (a negative one
    /// gives an already expired token).
    private static func pushedLifetime(_ seconds: Double, _ field: String) throws(BrokerError) -> TimeInterval {
        guard let lifetime = Bounds.lifetime(abs(seconds)) else {
            throw BrokerError(.badRequest, "\"\(field)\" must be a finite number of seconds")
        }
        return seconds < 0 ? -lifetime : lifetime
    }
}
