import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// What a successful refresh yields.
public struct Grant: Sendable, Equatable {
    public var token: AccessToken
    /// A rotated refresh token; `nil` when the IdP kept the old one.
    public var refreshToken: SecretBytes?
    public var refreshExpiresAt: Date?
    /// A rotated refresh URL (`refresh_url` accounts); `nil` when unchanged.
    public var refreshURL: SecretBytes?

    public init(
        token: AccessToken, refreshToken: SecretBytes? = nil, refreshExpiresAt: Date? = nil,
        refreshURL: SecretBytes? = nil
    ) {
        self.token = token
        self.refreshToken = refreshToken
        self.refreshExpiresAt = refreshExpiresAt
        self.refreshURL = refreshURL
    }
}

/// Why a refresh failed, classified the way the lifecycle needs it (protocol/PROTOCOL.md section 11).
public struct RefreshFailure: Error, Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// Network trouble, 5xx, 429, a malformed answer: keep everything, retry later.
        case transient
        /// The IdP refused the credential: stop refreshing until new tokens arrive.
        case denial
        /// The IdP refused the scope or resource a narrowed refresh asked for (`invalid_scope`,
        /// `invalid_target`); the credential itself is fine.
        case targetRefused
    }

    public var kind: Kind
    /// Human text for `status` and logs. It may quote the IdP; the broker cleans it (bounded,
    /// printable, the account's secrets redacted) before it is stored, logged or sent.
    public var message: String
    /// The IdP's `Retry-After`, in seconds, when it sent one.
    public var retryAfter: TimeInterval?

    public static func transient(_ message: String, retryAfter: TimeInterval? = nil) -> RefreshFailure {
        RefreshFailure(kind: .transient, message: message, retryAfter: retryAfter)
    }

    public static func denial(_ message: String) -> RefreshFailure {
        RefreshFailure(kind: .denial, message: message, retryAfter: nil)
    }
}

extension AccessToken {
    /// The access token of a token response object, read the RFC 6749 section 5.1 way
    /// (`token_type`, `expires_in`, `id_token`, `scope`); `expiresAt` overrides `expires_in`.
    /// A malformed `expires_in` is a transient failure; any lifetime is cut to `Bounds.maximumLifetime`.
    package static func issued(
        _ value: String, in object: [String: JSONValue], now: Date, expiresAt: Date? = nil,
        defaultLifetime: TimeInterval
    ) -> Result<AccessToken, RefreshFailure> {
        LifetimeField.read(object, "expires_in").flatMap { lifetime in
            SecretBytes.fromAnswer(value).flatMap { value in
                SecretBytes.fromAnswer(object["id_token"]?.text).flatMap { idToken in
                    AccessToken(
                        value: value, type: object["token_type"]?.text ?? "Bearer",
                        expiresAt: Bounds.date(expiresAt ?? now.addingTimeInterval(lifetime ?? defaultLifetime)),
                        obtainedAt: now, idToken: idToken, scope: object["scope"]?.text
                    ).checked()
                }
            }
        }
    }

    /// This token, or a malformed-answer failure when a field could not go into an HTTP header
    /// as clients use it (`Authorization: <type> <token>`).
    package func checked() -> Result<AccessToken, RefreshFailure> {
        if let field = unsafeField {
            return .failure(.transient("the answer has a malformed \(field) (not printable ASCII)"))
        }
        return .success(self)
    }

    /// The first field that is not header-safe: the token, its type and the ID token are visible
    /// ASCII without spaces (RFC 6750 section 2.1 is stricter still); a scope is printable ASCII
    /// without `"` or `\` (RFC 6749 section 3.3).
    package var unsafeField: String? { Self.unsafeField(value: value, type: type, idToken: idToken, scope: scope) }

    /// `unsafeField` of a token with these fields.
    package static func unsafeField(value: SecretBytes, type: String, idToken: SecretBytes?, scope: String?) -> String?
    {
        func visible(_ bytes: some Collection<UInt8>) -> Bool {
            !bytes.isEmpty && bytes.allSatisfy { $0 > 0x20 && $0 < 0x7F }
        }
        if !value.withUnsafeBytes(visible) { return "access_token" }
        if !visible(type.utf8) { return "token_type" }
        if let idToken, !idToken.withUnsafeBytes(visible) { return "id_token" }
        if let scope, !scope.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F && $0 != 0x22 && $0 != 0x5C }) { return "scope" }
        return nil
    }
}

/// Lifetime fields of IdP and helper answers (`expires_in`, `refresh_expires_in`).
package enum LifetimeField {
    /// Seconds from a JSON number or a numeric string (both forms occur); `nil` when absent or
    /// null. Negative, non-finite or non-numeric values are a malformed (transient) answer;
    /// longer lifetimes than `Bounds.maximumLifetime` are cut to it.
    package static func read(_ object: [String: JSONValue], _ field: String) -> Result<TimeInterval?, RefreshFailure> {
        let seconds: Double?
        switch object[field] {
        case nil, .null?: return .success(nil)
        case .number(let number)?: seconds = number
        case .string(let text)?: seconds = Double(text)
        default: seconds = nil
        }
        guard let seconds, let lifetime = Bounds.lifetime(seconds) else {
            return .failure(.transient("the answer has a malformed \(field) (not a number of seconds from 0 up)"))
        }
        return .success(lifetime)
    }
}

/// What became of a credential at `logout`.
public enum Revocation: Sendable, Equatable {
    /// The IdP confirmed the revocation.
    case revoked
    /// The provider has no revocation (or nothing to revoke); the credential is only discarded.
    case unsupported
}

/// A provider that can also obtain tokens narrowed to other scopes and bound to a resource
/// (`TokenKey`), from the same refresh credential.
public protocol NarrowingTokenProvider: TokenProvider {
    /// Exchanges the account's refresh credential for a token for `key`. The credential it
    /// rotates is the account's (there is one chain); the token is `key`'s alone.
    func refresh(_ record: AccountRecord, for key: TokenKey, now: Date) async -> Result<Grant, RefreshFailure>
}

/// One way of obtaining new tokens for an account.
public protocol TokenProvider: Sendable {
    /// Exchanges the account's refresh credential for new tokens.
    func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure>
    /// Revokes the account's credential at the IdP (`logout`). A transient failure may be
    /// retried; a denial means the IdP will not revoke it as configured.
    func revoke(_ record: AccountRecord) async -> Result<Revocation, RefreshFailure>
    /// Whether the source of the tokens may hold something new since `refresh` last read it.
    /// The engine asks on every poll of a kind that watches its source (`Renewal.watches`), on
    /// its own executor, so the answer must come from a quick local check (a `stat`).
    func sourceChanged() -> Bool
}

extension TokenProvider {
    /// Providers without a revocation endpoint have nothing to call.
    public func revoke(_ record: AccountRecord) async -> Result<Revocation, RefreshFailure> { .success(.unsupported) }

    /// Providers that are not polled cannot tell; a refresh finds out.
    public func sourceChanged() -> Bool { true }
}

extension SecretBytes {
    /// A secret of an IdP's answer in guarded memory, or, when none can be had, a transient
    /// failure: the refresh is retried later and the broker goes on.
    package static func fromAnswer(_ text: String?) -> Result<SecretBytes?, RefreshFailure> {
        do {
            return .success(try text.map(SecretBytes.init))
        } catch {
            return .failure(.transient("the broker is out of guarded memory for secrets"))
        }
    }

    /// `fromAnswer` of a secret the answer must have.
    package static func fromAnswer(_ text: String) -> Result<SecretBytes, RefreshFailure> {
        fromAnswer(Optional(text)).map { $0! }
    }
}
