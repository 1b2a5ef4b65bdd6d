import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault

/// The one login under way for an account. Every `login` of the account while it runs takes
/// part in it rather than starting another flow (a second browser window or device code):
/// each participant gets its progress from the start and its outcome.
package struct RunningLogin {
    /// What a participant receives: progress, then the outcome.
    package enum Update: Sendable {
        case progress(LoginProgress)
        case finished(Result<Outcome, BrokerFailure>)
    }

    package typealias Updates = AsyncStream<Update>
    /// What a successful login leaves: the account, and whether the IdP issued an id token.
    package typealias Outcome = (snapshot: AccountSnapshot, hasIDToken: Bool)

    /// Tells this login apart from a later one of the same account.
    package let serial: Int
    package let flow: LoginFlow
    /// The settings and client secret the flow runs with, which a joining `login` must not contradict.
    package let provider: ProviderConfig
    package let clientSecret: SecretBytes?
    /// The progress reported so far, and when, for those who join later.
    private(set) var said: [(progress: LoginProgress, at: ContinuousClock.Instant)] = []
    /// Each participant's updates, by participant.
    private(set) var participants: [Int: Updates.Continuation] = [:]
    /// The flow; cancelled when its last participant leaves.
    package var task: Task<Void, Never>?

    package init(serial: Int, flow: LoginFlow, provider: ProviderConfig, clientSecret: SecretBytes?) {
        self.serial = serial
        self.flow = flow
        self.provider = provider
        self.clientSecret = clientSecret
    }

    /// Adds participant `id`; a joiner (`joining`) is first told so, then what was said so
    /// far, with the time left as it is now.
    package mutating func add(_ id: Int, joining: Bool) -> Updates {
        let (updates, continuation) = Updates.makeStream()
        if joining {
            continuation.yield(.progress(LoginProgress(event: .joined, flow: flow)))
            let now = ContinuousClock.now
            for (progress, at) in said {
                var progress = progress
                progress.expiresIn = progress.expiresIn.map {
                    max(1, $0 - Int(at.duration(to: now).components.seconds))
                }
                continuation.yield(.progress(progress))
            }
        }
        participants[id] = continuation
        return updates
    }

    /// Removes participant `id`; `true` when none is left.
    package mutating func remove(_ id: Int) -> Bool {
        participants.removeValue(forKey: id)?.finish()
        return participants.isEmpty
    }

    /// Records `progress` and passes it to every participant.
    package mutating func report(_ progress: LoginProgress) {
        said.append((progress, ContinuousClock.now))
        for continuation in participants.values { continuation.yield(.progress(progress)) }
    }

    /// Gives every participant the outcome.
    package func finish(_ outcome: Result<Outcome, BrokerFailure>) {
        for continuation in participants.values {
            continuation.yield(.finished(outcome))
            continuation.finish()
        }
    }
}
