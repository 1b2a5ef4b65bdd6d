import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault

/// One connection's caller and the accounts it may use, each decided once and kept until the
/// rules change (a reload), so the cached-token path pays a lookup, not a check; an account
/// whose rule names programs also asks `/proc` whether the caller still runs the program it
/// connected with. Owned by the connection's handler, on its event loop.
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
    private var decisions: [String: Decision] = [:]

    /// What a caller's request for an account gets.
    private enum Decision {
        case refused
        case allowed
        /// Allowed while the caller runs the program it connected with (`Caller.isUnchanged`).
        case allowedUnchanged
    }

    init(policy: AccessPolicy, caller: Caller) {
        self.policy = policy
        self.caller = caller
    }

    /// Whether the caller may use `account` under the rules in force; a refusal is logged.
    mutating func mayUse(_ account: String) -> Bool {
        takeNewRules()
        var reason: String?
        switch decisions[account] {
        // A fresh decision asked `/proc` already (`AccessPolicy.mayUse`).
        case nil: if decide(account) != .refused { return true }
        case .allowed: return true
        case .allowedUnchanged:
            if caller.isUnchanged() { return true }
            reason = "its process no longer runs the program it connected with"
        case .refused: break
        }
        // Quoted and cut: the name is the caller's text.
        policy.noteRefusal(
            of: caller, "account " + JSONText.quote(String(account.prefix(Self.maximumRememberedName))),
            because: reason)
        return false
    }

    private mutating func decide(_ account: String) -> Decision {
        let decision: Decision =
            switch (policy.mayUse(account, caller: caller, rules: rules), rules.accounts[account]?.namesPrograms) {
            case (false, _): .refused
            case (true, true): .allowedUnchanged
            case (true, _): .allowed
            }
        guard account.utf8.count <= Self.maximumRememberedName else { return decision }
        if decisions.count >= Self.maximumRemembered { decisions.removeAll(keepingCapacity: true) }
        decisions[account] = decision
        return decision
    }

    /// Whether the caller may run the owner operation `operation` (judged afresh each time, by
    /// what the caller was when it connected and what it is now).
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
