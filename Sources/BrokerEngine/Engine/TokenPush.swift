import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// Tokens a person pushes into an account (`add`, `setTokens`), checked where they came in.
public struct TokenPush: Sendable, Equatable {
    /// When a pushed token expires.
    public enum Expiry: Sendable, Equatable {
        /// At this instant.
        case at(Date)
        /// This many seconds after the broker receives it (negative: already expired).
        case after(TimeInterval)
    }

    /// A pushed access token whose fields can go into HTTP headers.
    public struct Access: Sendable, Equatable {
        public let value: SecretBytes
        public let type: String
        /// `nil`: the broker's default lifetime.
        public let expiry: Expiry?
        public let idToken: SecretBytes?
        public let scope: String?

        /// Refuses an empty token and fields that could not go into an HTTP header
        /// (`Authorization: <type> <token>`). The type is `Bearer` unless given.
        public init(value: String, type: String?, expiry: Expiry?, idToken: String?, scope: String?)
            throws(BrokerFailure)
        {
            guard !value.isEmpty else { throw .invalid("\"access_token\" is empty") }
            let type = type ?? "Bearer"
            let (value, idToken) = (try SecretBytes(value), try idToken.map(SecretBytes.init))
            if let field = AccessToken.unsafeField(value: value, type: type, idToken: idToken, scope: scope) {
                throw .invalid("\"\(field)\" must be printable ASCII (it goes into HTTP headers)")
            }
            (self.value, self.type, self.expiry, self.idToken, self.scope) = (value, type, expiry, idToken, scope)
        }
    }

    public var access: Access?
    public var refreshToken: SecretBytes?
    /// `nil`: the refresh token's expiry is not known.
    public var refreshExpiry: Expiry?
    public var refreshURL: SecretBytes?
    /// A new client secret for the account, which corrects a wrong one in place.
    public var clientSecret: SecretBytes?

    public init(
        access: Access? = nil, refreshToken: SecretBytes? = nil, refreshExpiry: Expiry? = nil,
        refreshURL: SecretBytes? = nil, clientSecret: SecretBytes? = nil
    ) {
        self.access = access
        self.refreshToken = refreshToken
        self.refreshExpiry = refreshExpiry
        self.refreshURL = refreshURL
        self.clientSecret = clientSecret
    }

    /// Whether it carries nothing that could serve or obtain a token.
    package var isEmpty: Bool { access == nil && refreshToken == nil && refreshURL == nil }
}

extension TokenPush.Expiry {
    /// The instant it names, for a token received at `now`.
    package func date(receivedAt now: Date) -> Date {
        switch self {
        case .at(let date): return date
        case .after(let seconds): return now.addingTimeInterval(seconds)
        }
    }
}
