import BrokerModel
import BrokerSecrets
import FoundationEssentials
import Synchronization

/// The last `DPoP-Nonce` each IdP endpoint gave (RFC 9449 section 8), by its normal form without query
/// (`NormalizedURL`; the realms of one Keycloak share an origin, not their nonces), so that the next request
/// sends it without another `use_dpop_nonce` round. Kept in memory only: after a restart the
/// first request costs at most one retry.
package final class DPoPNonces: Sendable {
    /// Endpoints remembered at most; past it the oldest goes (a few IdPs in practice).
    package static let limit = 64
    private let nonces = Mutex<[(endpoint: String, nonce: String)]>([])

    /// The nonce last given by the endpoint at `url`.
    package func nonce(for url: URL) -> String? {
        guard let endpoint = NormalizedURL(url.absoluteString)?.description else { return nil }
        return nonces.withLock { list in list.last { $0.endpoint == endpoint }?.nonce }
    }

    /// Keeps `nonce` for the endpoint at `url`, when it is one a proof may carry.
    package func remember(_ nonce: String, for url: URL) {
        guard let endpoint = NormalizedURL(url.absoluteString)?.description, DPoPTarget.isNonce(nonce) else { return }
        nonces.withLock { list in
            list.removeAll { $0.endpoint == endpoint }
            list.append((endpoint, nonce))
            if list.count > Self.limit { list.removeFirst() }
        }
    }
}
