import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// The secrets of one browser login (RFC 7636, S256): the code verifier the broker keeps, the
/// challenge the authorization URL carries, and the `state` that ties the redirect to this
/// login. Each is 32 random bytes (256 bits) from libsodium, base64url without padding; the
/// verifier, the one secret of the three, in guarded memory.
package struct PKCE: Sendable {
    package let verifier: SecretBytes
    package let challenge: String
    package let state: String

    /// Fresh random values.
    package init() throws(BrokerFailure) {
        let verifier = Base64URL.encode(Sodium.randomBytes(32))
        try self.init(verifier: verifier, state: Base64URL.encode(Sodium.randomBytes(32)))
    }

    /// The values for a known verifier (RFC 7636 appendix B checks the challenge).
    package init(verifier: String, state: String) throws(BrokerFailure) {
        self.verifier = try SecretBytes(verifier)
        challenge = Base64URL.encode(Sodium.sha256(Array(verifier.utf8)))
        self.state = state
    }
}
