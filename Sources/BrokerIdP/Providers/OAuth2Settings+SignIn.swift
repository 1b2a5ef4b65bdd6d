import BrokerModel
import BrokerProtocol
import BrokerSecrets

/// Which sign-in can restore an account of these settings (`Restoration`, in BrokerModel, knows
/// nothing of providers).
extension OAuth2Settings {
    /// The login flows that can run for these settings given `discovered`, what the issuer's
    /// discovery document named (if read); `nil` when it matters and was not read.
    package func signInFlows(discovered: DiscoveredEndpoints?) -> Set<LoginFlow>? {
        if issuer != nil, discovered == nil, authorizationEndpoint == nil || deviceAuthorizationEndpoint == nil {
            return nil
        }
        var flows: Set<LoginFlow> = []
        if authorizationEndpoint ?? discovered?.authorization != nil { flows.insert(.browser) }
        if deviceAuthorizationEndpoint ?? discovered?.deviceAuthorization != nil { flows.insert(.device) }
        return flows
    }

    /// The sign-in that can run, or the push of a refresh token when none can.
    package func restoration(discovered: DiscoveredEndpoints?) -> Restoration {
        guard let flows = signInFlows(discovered: discovered) else { return .signIn(flow: nil) }
        switch flows.count {
        case 0: return .push(field: "refresh_token", noSignIn: true)
        case 1: return .signIn(flow: flows.first)
        default: return .signIn(flow: nil)
        }
    }
}
