import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// The IdP endpoints of one DPoP account, for which a program gets no proof: with one, a
/// refresh token that leaked could be used without the broker, burning its chain
/// (docs/dpop.md, "No proof for the IdP's doors"). They are known from the settings when the
/// account loads (issuer, token, revocation, authorization and device endpoints) and from the
/// issuer's discovery document once it is read (those and its PAR and introspection
/// endpoints); no URL on their origins gets a proof unless the account's `dpop_allow` lists it,
/// and an endpoint never does. Until the document is read, the issuer's origin is all that is
/// known of the IdP, and it is refused whole.
public struct DPoPIdPEndpoints: Sendable {
    /// The endpoints the settings name.
    private let configured: [DPoPDoor]
    /// The issuer whose discovery document names more, if any.
    private let issuer: URL?
    private let discovery: DiscoveryCache
    /// What `dpop_allow` lists.
    private let allowed: Set<DPoPDoor>

    package init(settings: OAuth2Settings, discovery: DiscoveryCache) {
        let urls = [
            settings.issuer, settings.tokenEndpoint, settings.revocationEndpoint, settings.authorizationEndpoint,
            settings.deviceAuthorizationEndpoint,
        ]
        configured = urls.compactMap { $0.flatMap(DPoPDoor.init) }
        issuer = settings.issuer
        self.discovery = discovery
        allowed = Set((settings.dpopAllow ?? []).compactMap { NormalizedURL($0).map(DPoPDoor.init) })
    }

    /// Why no proof is made for `url` (a rule, named for the program that asked), or `nil`.
    public func refusal(for url: NormalizedURL) -> String? {
        let door = DPoPDoor(url)
        let endpoints = configured + (issuer.flatMap { discovery.knownDoors(issuer: $0) } ?? [])
        if endpoints.contains(door) {
            return "its htu is an endpoint of the account's IdP, which only brokerd calls"
        }
        guard endpoints.contains(where: { $0.origin == door.origin }) else { return nil }
        if url.path.contains("%2F") || url.path.contains("%5C") {
            return "its htu is on the origin of the account's IdP and has an escaped / or \\ in its path"
        }
        if !allowed.contains(door) {
            return "its htu is on the origin of the account's IdP and the account's dpop_allow does not list it"
        }
        return nil
    }
}
