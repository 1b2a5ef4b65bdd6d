import BrokerProtocol

/// What brings back an account that serves no token, worked out from what can work for that
/// account: a sign-in only with a flow whose endpoint its IdP offers, otherwise the push of the
/// credential its kind refreshes with, and the correction of a client the IdP refuses. Every
/// message that sends a person somewhere (`BrokerFailure`, `status`) names the command this gives,
/// so no advice leads to a command that refuses the same account.
public enum Restoration: Sendable, Equatable {
    /// `brokerctl login NAME`, with `--flow` when only that flow's endpoint is known; `nil`: both
    /// are offered, or the issuer's discovery document was not read yet (the login reads it).
    case signIn(flow: LoginFlow?)
    /// `brokerctl set-tokens NAME` with `field` (`refresh_token`, `refresh_url`, `access_token`);
    /// `noSignIn` when the account is an oauth2 one whose IdP offers neither sign-in endpoint.
    case push(field: String, noSignIn: Bool)
    /// The IdP refuses the account's client: `brokerctl update NAME` corrects its secret (or,
    /// for an account not declared in broker.toml, its client id and authentication) in place.
    case correctClient(declared: Bool)
    /// A command outside the broker denied the refresh: once it signs in again (with its own
    /// tool), `brokerctl refresh NAME` asks it again.
    case askCommandAgain
    /// Refreshes are failing for a reason that may pass: the broker retries on its own, and
    /// `brokerctl refresh NAME` tries at once.
    case retry
    /// Its record in the vault cannot be read by this release: a release that reads it serves
    /// it again, or `brokerctl remove NAME` deletes it.
    case removeDamaged

    /// The command that does it, for the account named `name`.
    public func command(for name: String) -> String {
        switch self {
        case .signIn(let flow): return "brokerctl login \(name)" + (flow.map { " --flow \($0.rawValue)" } ?? "")
        case .push: return "brokerctl set-tokens \(name)"
        case .correctClient: return "brokerctl update \(name) --secrets -"
        case .askCommandAgain, .retry: return "brokerctl refresh \(name)"
        case .removeDamaged: return "brokerctl remove \(name)"
        }
    }

    /// The advice in a sentence: what to do, with the command (and the op a program sends).
    public func sentence(for name: String) -> String {
        let command = command(for: name)
        switch self {
        case .signIn: return "sign in with \(command)"
        case .push(let field, let noSignIn):
            return "push a new \(field) with \(command) (op set_tokens), which reads {\"\(field)\": ...} as JSON"
                + (noSignIn
                    ? "; its IdP offers no sign-in endpoint (brokerctl update \(name) --authorization-endpoint URL "
                        + "or --device-authorization-endpoint URL adds one)" : "")
        case .correctClient(let declared):
            return "correct the client secret with \(command), which reads {\"client_secret\": ...} as JSON"
                + (declared
                    ? " (client_id and client_auth are in its broker.toml table: edit them, then brokerctl reload)"
                    : " (--client-id and --client-auth change the others)")
        case .askCommandAgain:
            return "sign in with the command's own tool, then ask it again with \(command)"
        case .retry:
            return "the broker retries on its own; to try at once: \(command)"
        case .removeDamaged:
            return "run a brokerd release that reads it (the one that wrote it), or delete it with \(command)"
        }
    }
}
