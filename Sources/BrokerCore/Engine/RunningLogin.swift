import BrokerProtocol

/// The one login under way for an account. Every `login` of the account while it runs takes
/// part in it rather than starting another flow (a second browser window or device code):
/// each participant gets its progress from the start and its outcome.
struct RunningLogin {
    /// What a participant receives: progress, then the outcome.
    enum Update: Sendable {
        case progress(LoginProgress)
        case finished(Result<Outcome, BrokerFailure>)
    }

    typealias Updates = AsyncStream<Update>
    /// What a successful login leaves: the account, and whether the IdP issued an id token.
    typealias Outcome = (snapshot: AccountSnapshot, hasIDToken: Bool)

    /// Tells this login apart from a later one of the same account.
    let serial: Int
    let flow: LoginFlow
    /// The settings and client secret the flow runs with, which a joining `login` must not contradict.
    let provider: ProviderConfig
    let clientSecret: SecretBytes?
    /// The progress reported so far, and when, for those who join later.
    private(set) var said: [(progress: LoginProgress, at: ContinuousClock.Instant)] = []
    /// Each participant's updates, by participant.
    private(set) var participants: [Int: Updates.Continuation] = [:]
    /// The flow; cancelled when its last participant leaves.
    var task: Task<Void, Never>?

    init(serial: Int, flow: LoginFlow, provider: ProviderConfig, clientSecret: SecretBytes?) {
        self.serial = serial
        self.flow = flow
        self.provider = provider
        self.clientSecret = clientSecret
    }

    /// Adds participant `id`; a joiner (`joining`) is first told so, then what was said so
    /// far, with the time left as it is now.
    mutating func add(_ id: Int, joining: Bool) -> Updates {
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
    mutating func remove(_ id: Int) -> Bool {
        participants.removeValue(forKey: id)?.finish()
        return participants.isEmpty
    }

    /// Records `progress` and passes it to every participant.
    mutating func report(_ progress: LoginProgress) {
        said.append((progress, ContinuousClock.now))
        for continuation in participants.values { continuation.yield(.progress(progress)) }
    }

    /// Gives every participant the outcome.
    func finish(_ outcome: Result<Outcome, BrokerFailure>) {
        for continuation in participants.values {
            continuation.yield(.finished(outcome))
            continuation.finish()
        }
    }
}
