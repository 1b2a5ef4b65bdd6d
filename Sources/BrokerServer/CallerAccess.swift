import BrokerCore
import BrokerProtocol

/// One connection's caller and the accounts it may use, each decided once and kept until the
/// rules change (a reload), so the cached-token path pays a lookup, not a check. Owned by the
/// connection's handler, on its event loop.
struct CallerAccess {
    /// Accounts remembered at most; a caller asking for more starts the memo afresh.
    static let maximumRemembered = 256
    /// Longest name remembered (an account name's limit), so the memo stays small.
    static let maximumRememberedName = 128

    let policy: AccessPolicy
    /// The caller, attested when it connected.
    let caller: Caller
    private var rules = AccessRules()
    private var generation: Int?
    private var decisions: [String: Bool] = [:]

    init(policy: AccessPolicy, caller: Caller) {
        self.policy = policy
        self.caller = caller
    }

    /// Whether the caller may use `account` under the rules in force; a refusal is logged.
    mutating func mayUse(_ account: String) -> Bool {
        takeNewRules()
        let allowed = decisions[account] ?? decide(account)
        if !allowed {
            // Quoted and cut: the name is the caller's text.
            policy.noteRefusal(
                of: caller, "account " + JSONText.quote(String(account.prefix(Self.maximumRememberedName))))
        }
        return allowed
    }

    private mutating func decide(_ account: String) -> Bool {
        let allowed = policy.mayUse(account, caller: caller, rules: rules)
        guard account.utf8.count <= Self.maximumRememberedName else { return allowed }
        if decisions.count >= Self.maximumRemembered { decisions.removeAll(keepingCapacity: true) }
        decisions[account] = allowed
        return allowed
    }

    /// Whether the caller may run the owner operation `operation` (judged afresh each time:
    /// the caller may have exec'ed another program since it connected).
    mutating func mayRunOwnerOperation(_ operation: String) -> Bool {
        takeNewRules()
        let allowed = policy.isAdmin(caller, rules: rules)
        if !allowed { policy.noteRefusal(of: caller, "operation \(operation)") }
        return allowed
    }

    /// Forgets every decision when the rules changed since they were taken.
    private mutating func takeNewRules() {
        guard policy.rules.generation != generation else { return }
        (rules, generation) = policy.rules.snapshot()
        decisions.removeAll()
    }
}
