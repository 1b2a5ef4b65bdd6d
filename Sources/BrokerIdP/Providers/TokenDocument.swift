import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// A token set as a helper prints it (`exec`) or a token file holds it (`file`): a JSON object
/// with `access_token`, then `expires_at` (ISO 8601, UTC when zone-less) or `expires_in`
/// (seconds, from `issuedAt`), and optionally `token_type`, `id_token` and `scope`.
package enum TokenDocument {
    /// The access token `object` holds; `source` names where it came from in failures
    /// ("the command's output"). Every failure is a malformed (transient) answer.
    package static func read(
        _ object: [String: JSONValue]?, issuedAt: Date, defaultLifetime: TimeInterval, source: String
    )
        -> Result<AccessToken, RefreshFailure>
    {
        guard let object, let accessToken = object["access_token"]?.text, !accessToken.isEmpty else {
            return .failure(.transient("\(source) is not a JSON object with an access_token"))
        }
        var expiresAt: Date?
        if let text = object["expires_at"]?.text {
            expiresAt = Timestamp.parse(text, defaultZone: .utc)
            if expiresAt == nil { return .failure(.transient("\(source) has an unreadable expires_at")) }
        }
        return AccessToken.issued(
            accessToken, in: object, now: issuedAt, expiresAt: expiresAt, defaultLifetime: defaultLifetime
        ).mapError { .transient("\(source): \($0.message)") }
    }
}
