import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// What the broker reads of an id token: the `exp` of its JWT payload (the base64url JSON of the
/// middle of three segments), for the expiry it answers with. Nothing else is read or trusted.
package enum IDToken {
    /// Longest payload segment read, in characters.
    package static let maximumPayload = 16 * 1024

    /// The payload's `exp`, or `nil` when the token is not a readable JWT with a finite `exp`
    /// within `Bounds.representableDates`.
    package static func expiry(of token: String) -> Date? {
        let segments = token.split(separator: ".", omittingEmptySubsequences: false)
        guard segments.count == 3, segments[1].utf8.count <= maximumPayload,
            let payload = Base64URL.decode(segments[1]),
            let exp = JSONValue.object(decoding: payload)?["exp"]?.number, exp.isFinite,
            exp >= Bounds.representableDates.lowerBound.timeIntervalSince1970,
            exp <= Bounds.representableDates.upperBound.timeIntervalSince1970
        else { return nil }
        return Date(timeIntervalSince1970: exp)
    }
}
