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

    /// Validates a provider object with its kind's rules; returns its settings and the client
    /// secret it carried. Every field any kind knows is type-checked, whatever the kind.
    static func provider(_ spec: ProviderSpec?) throws(BrokerError) -> (ProviderConfig, clientSecret: String?) {
        guard let spec else { throw BrokerError(.badRequest, "the field \"provider\" is required") }
        guard let kind = ProviderKinds.named(spec.kind) else {
            throw BrokerError(
                .badRequest,
                "unknown provider kind \"\(InputEcho.printable(spec.kind))\"; use \(ProviderKinds.names)")
        }
        let fields = ProviderFields(spec: spec)
        for field in ProviderKinds.fields { try fields.check(field) }
        let settings = try kind.init(checking: fields)
        let clientSecret = kind.fields.contains(.clientSecret) ? try fields.text(ProviderField.clientSecret.name) : nil
        return (ProviderConfig(settings), clientSecret)
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
