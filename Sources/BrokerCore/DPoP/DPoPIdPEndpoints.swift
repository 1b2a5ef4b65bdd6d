import FoundationEssentials
import Synchronization

/// The IdP endpoints DPoP accounts send their own proofs to (token, revocation and device
/// endpoints, configured or discovered), which a program may not have a proof made for: with
/// one, a refresh token that leaked could be used without the broker, burning its chain.
/// Proofs for the account's resource servers, the same origin included (a userinfo endpoint),
/// stay allowed. Compared by origin and path (`Origin`: scheme and host lowercased, the
/// default port made explicit).
public final class DPoPIdPEndpoints: Sendable {
    public init() {}

    /// Endpoints remembered at most (a few per IdP in practice); past it one is forgotten.
    static let limit = 1024
    private let endpoints = Mutex<Set<String>>([])

    /// Remembers `url`, an endpoint the broker sends a DPoP account's requests to.
    func insert(_ url: URL?) {
        guard let key = url?.originAndPath else { return }
        endpoints.withLock { set in
            if set.insert(key).inserted, set.count > Self.limit { set.remove(set.first { $0 != key } ?? key) }
        }
    }

    /// Whether `text`, a proof's `htu`, names one of the endpoints.
    public func contains(_ text: String) -> Bool {
        guard let key = URL(string: text)?.originAndPath else { return false }
        return endpoints.withLock { $0.contains(key) }
    }
}

extension URL {
    /// The origin (`Origin`: scheme and host lowercased, the port made explicit) and the path,
    /// without query and fragment: how DPoP's endpoints are told apart.
    var originAndPath: String? { Origin(self).map { "\($0)\(path(percentEncoded: true))" } }
}
