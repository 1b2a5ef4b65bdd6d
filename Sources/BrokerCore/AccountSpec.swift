import BrokerProtocol
import Foundation

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
            guard let endpoint = spec.tokenEndpoint else {
                throw BrokerError(.badRequest, "an oauth2 provider needs \"token_endpoint\"")
            }
            guard let url = URL(string: endpoint), EndpointPolicy.isAllowed(url) else {
                throw BrokerError(.badRequest, "\"token_endpoint\" must be an https URL (http only for loopback)")
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
            let settings = OAuth2Settings(tokenEndpoint: url, clientID: clientID, clientAuth: auth, scope: spec.scope)
            return (.oauth2(settings), spec.clientSecret)
        default:
            throw BrokerError(.badRequest, "unknown provider kind \"\(FormEncoding.printable(spec.kind))\"; use oauth2 or static")
        }
    }

    /// The access token a `tokens` object carries, if any.
    static func accessToken(_ tokens: TokenSet, now: Date, defaultLifetime: TimeInterval) throws(BrokerError)
        -> AccessToken?
    {
        guard let value = tokens.accessToken else { return nil }
        guard !value.isEmpty else { throw BrokerError(.badRequest, "\"access_token\" is empty") }
        let expiresAt = tokens.expiresAt ?? now.addingTimeInterval(tokens.expiresIn ?? defaultLifetime)
        return AccessToken(
            value: value, type: tokens.tokenType ?? "Bearer", expiresAt: expiresAt, obtainedAt: now,
            idToken: tokens.idToken, scope: tokens.scope)
    }

    /// The refresh token's expiry a `tokens` object states, if any.
    static func refreshExpiry(_ tokens: TokenSet, now: Date) -> Date? {
        tokens.refreshExpiresAt ?? tokens.refreshExpiresIn.map { now.addingTimeInterval($0) }
    }
}
