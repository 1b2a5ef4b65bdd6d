import FoundationEssentials
import Synchronization

/// The last `DPoP-Nonce` each IdP gave (RFC 9449 section 8), by the origin of its token
/// endpoint, so that the next request sends it without another `use_dpop_nonce` round. Kept in
/// memory only: after a restart the first request costs at most one retry.
final class DPoPNonces: Sendable {
    /// Origins remembered at most; past it the oldest goes (a few IdPs in practice).
    static let limit = 64
    private let nonces = Mutex<[(origin: Origin, nonce: String)]>([])

    /// The nonce last given by the IdP at `url`'s origin.
    func nonce(for url: URL) -> String? {
        guard let origin = Origin(url) else { return nil }
        return nonces.withLock { list in list.last { $0.origin == origin }?.nonce }
    }

    /// Keeps `nonce` for `url`'s origin, when it is one a proof may carry.
    func remember(_ nonce: String, for url: URL) {
        guard let origin = Origin(url), DPoPTarget.isNonce(nonce) else { return }
        nonces.withLock { list in
            list.removeAll { $0.origin == origin }
            list.append((origin, nonce))
            if list.count > Self.limit { list.removeFirst() }
        }
    }
}
