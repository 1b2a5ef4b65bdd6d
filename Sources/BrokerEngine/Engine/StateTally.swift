import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// How many accounts are in each state (the service manager's `STATUS=`), kept as accounts
/// change instead of counted over every account: a changed account is marked, and counted again
/// at the next `settle`, as is one whose token expired since it was counted (its state changes
/// then by itself).
package struct StateTally: Sendable {
    /// The accounts counted in each state; a state without any is absent.
    private(set) var counts: [AccountState: Int] = [:]
    /// The state each account was counted in.
    private var counted: [String: AccountState] = [:]
    /// The token expiry of each account counted before it.
    private var expiries = DeadlineQueue<String>()
    /// The accounts changed since they were counted.
    private var changed: Set<String> = []
    /// The time of the last `settle`.
    private var settledAt: Date?

    /// When a counted state next changes by itself: the earliest expiry of a token counted before it.
    package var nextChange: Date? { expiries.earliest }

    /// `name` changed (added, removed or another state): it is counted again at the next `settle`.
    package mutating func markChanged(_ name: String) {
        changed.insert(name)
    }

    /// Brings `counts` to the states of `machines` at `now`: counts again the accounts changed
    /// since the last settle and those whose token expired since.
    package mutating func settle(now: Date, machines: [String: AccountMachine]) {
        if let settledAt, now < settledAt {
            // The wall clock was set back: an expired token may be valid again.
            changed.formUnion(counted.keys)
        }
        for name in changed.union(expiries.keys(dueBy: now)) {
            recount(name, machines[name], now: now)
        }
        changed = []
        settledAt = now
    }

    private mutating func recount(_ name: String, _ machine: AccountMachine?, now: Date) {
        if let old = counted.removeValue(forKey: name) {
            let left = (counts[old] ?? 0) - 1
            counts[old] = left > 0 ? left : nil
        }
        expiries[name] = machine?.record.token.map(\.expiresAt).flatMap { $0 > now ? $0 : nil }
        guard let machine else { return }
        let state = machine.state(now: now)
        counted[name] = state
        counts[state, default: 0] += 1
    }
}
