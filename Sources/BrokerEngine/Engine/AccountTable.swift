import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// Every account's machine by name, with what the scheduler and the service status need kept
/// up to date as each machine changes: when the scheduler must look at each account
/// (`DeadlineQueue`) and how many accounts are in each state (`StateTally`). A change to one
/// account costs the same however many there are: a machine is changed in place through the
/// subscript (the dictionary is never copied), and the change is announced to `changes`.
package struct AccountTable: Sendable {
    private(set) var machines: [String: AccountMachine] = [:]
    /// When the scheduler looks at each account next (`AccountMachine.wakeAt`).
    private var deadlines = DeadlineQueue<String>()
    private var tally = StateTally()
    private let changes: ChangeBroadcast

    package init(changes: ChangeBroadcast) {
        self.changes = changes
    }

    package var count: Int { machines.count }

    /// The machine of `name`; changed in place, then indexed again and announced.
    package subscript(name: String) -> AccountMachine? {
        get { machines[name] }
        _modify {
            defer { changed(name) }
            yield &machines[name]
        }
    }

    @discardableResult
    package mutating func removeValue(forKey name: String) -> AccountMachine? {
        defer { changed(name) }
        return machines.removeValue(forKey: name)
    }

    /// Takes `replacement` as every account (at start, unlock and lock).
    package mutating func replaceAll(with replacement: [String: AccountMachine]) {
        let names = Set(machines.keys).union(replacement.keys)
        machines = replacement
        for name in names { index(name) }
        changes.announce()
    }

    // MARK: The scheduler's deadlines

    /// The earliest time the scheduler must look at some account.
    package var nextDeadline: Date? { deadlines.earliest }

    /// The accounts the scheduler must look at by `now`.
    package func names(dueBy now: Date) -> [String] {
        deadlines.keys(dueBy: now)
    }

    /// Looks at `name` again at `date` rather than at its machine's deadline, until it changes
    /// (a due refresh that may not start before then).
    package mutating func postpone(_ name: String, to date: Date) {
        deadlines[name] = date
    }

    // MARK: The count of each state

    /// How many accounts are in each state at `now`.
    package mutating func stateCounts(now: Date) -> [AccountState: Int] {
        tally.settle(now: now, machines: machines)
        return tally.counts
    }

    /// When a state counted by `stateCounts` next changes by itself (a token's expiry).
    package var nextStateChange: Date? { tally.nextChange }

    // MARK: Helpers

    private mutating func changed(_ name: String) {
        index(name)
        changes.announce()
    }

    private mutating func index(_ name: String) {
        deadlines[name] = machines[name]?.wakeAt
        tally.markChanged(name)
    }
}
