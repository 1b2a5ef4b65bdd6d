@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// The indexes `AccountTable` keeps as accounts change (the count of each state, the
/// scheduler's deadlines, the next expiry) stay equal to what a walk over every account finds,
/// through random sequences of additions, removals, transitions and clock steps (seeded, so a
/// failure repeats).
@Suite struct AccountTableTests {
    let start = Date(timeIntervalSince1970: 1_800_000_000)
    let planner = RefreshPlanner.withoutJitter

    @Test func countsAndDeadlinesEqualAFullRecountAfterRandomChanges() {
        for seed in UInt64(1)...12 {
            var generator = SeededGenerator(seed: seed)
            var table = AccountTable(changes: ChangeBroadcast())
            var now = start
            var serial = 0
            for step in 0..<600 {
                let names = table.machines.keys.sorted()
                switch Int.random(in: 0..<10, using: &generator) {
                case 0, 1:
                    let name = "acct-\(Int.random(in: 0..<40, using: &generator))"
                    table[name] = newMachine(name, now: now, using: &generator)
                case 2:
                    if let name = names.randomElement(using: &generator) { table.removeValue(forKey: name) }
                case 3:
                    let back = Int.random(in: 0..<8, using: &generator) == 0
                    now = now.addingTimeInterval(Double(Int.random(in: 0...3000, using: &generator)) * (back ? -1 : 1))
                default:
                    guard let name = names.randomElement(using: &generator) else { continue }
                    serial += 1
                    change(&table[name]!, serial: serial, now: now, using: &generator)
                }
                // Not after every step: several changes may wait for one count.
                if Int.random(in: 0..<3, using: &generator) == 0 {
                    expectIndexesMatch(&table, now: now, "seed \(seed), step \(step)")
                }
            }
            expectIndexesMatch(&table, now: now, "seed \(seed), end")
        }
    }

    @Test func aTokenThatExpiresChangesTheCountWithoutAnyChange() {
        var table = AccountTable(changes: ChangeBroadcast())
        var record = record("pushed", provider: ProviderConfig(StaticSettings()))
        record.token = token(at: start, lifetime: 60)
        table["pushed"] = AccountMachine(record: record, planner: planner, now: start)
        #expect(table.stateCounts(now: start) == [.valid: 1])
        #expect(table.nextStateChange == start.addingTimeInterval(60))
        #expect(table.stateCounts(now: start.addingTimeInterval(60)) == [.needsLogin: 1])
        #expect(table.nextStateChange == nil)
        // The wall clock set back: the token is valid again.
        #expect(table.stateCounts(now: start.addingTimeInterval(30)) == [.valid: 1])
        table.removeValue(forKey: "pushed")
        #expect(table.stateCounts(now: start.addingTimeInterval(30)) == [:])
    }

    @Test func aDueAccountIsFoundByItsDeadlineAndMayBePostponed() {
        var table = AccountTable(changes: ChangeBroadcast())
        table["soon"] = AccountMachine(record: record("soon"), planner: planner, now: start)
        var later = record("later")
        later.token = token(at: start, lifetime: 3600)
        table["later"] = AccountMachine(record: later, planner: planner, now: start)
        // No token: due at once; a token of an hour: due when a quarter of it remains.
        #expect(table.names(dueBy: start) == ["soon"])
        #expect(table.nextDeadline == start)
        table.postpone("soon", to: start.addingTimeInterval(10))
        #expect(table.names(dueBy: start).isEmpty)
        #expect(table.nextDeadline == start.addingTimeInterval(10))
        // A change to the account takes its machine's deadline again.
        #expect(table["soon"]?.beginRefresh(serial: 1) == true)
        #expect(table.nextDeadline == start.addingTimeInterval(2700))
        #expect(table.names(dueBy: start.addingTimeInterval(2700)) == ["later"])
    }

    // MARK: Helpers

    /// Compares every index with a walk over every machine at `now`.
    func expectIndexesMatch(_ table: inout AccountTable, now: Date, _ context: String) {
        let machines = table.machines
        var counts: [AccountState: Int] = [:]
        for machine in machines.values { counts[machine.state(now: now), default: 0] += 1 }
        #expect(table.stateCounts(now: now) == counts, "\(context)")
        let expiries = machines.values.compactMap { $0.record.token?.expiresAt }.filter { $0 > now }
        #expect(table.nextStateChange == expiries.min(), "\(context)")
        #expect(table.nextDeadline == machines.values.compactMap(\.wakeAt).min(), "\(context)")
        let due = machines.filter { $0.value.wakeAt.map { $0 <= now } == true }.keys.sorted()
        #expect(table.names(dueBy: now).sorted() == due, "\(context)")
    }

    /// A machine of a random kind and state: refreshing, pushed or watching a file; with a
    /// token of a random lifetime (some expired), none, or a credential refused or logged out.
    func newMachine(_ name: String, now: Date, using generator: inout SeededGenerator) -> AccountMachine {
        let providers = [
            oauth2, ProviderConfig(StaticSettings()), ProviderConfig(FileSettings(path: "/run/user/1000/token.json")),
        ]
        var record = record(name, provider: providers.randomElement(using: &generator)!)
        let lifetime = Double(Int.random(in: -600...4000, using: &generator))
        record.token = Int.random(in: 0..<5, using: &generator) == 0 ? nil : token(at: now, lifetime: lifetime)
        switch Int.random(in: 0..<5, using: &generator) {
        case 0: record.needsLogin = true
        case 1: record.loggedOut = true
        default: break
        }
        return AccountMachine(record: record, planner: planner, now: now)
    }

    /// One random transition of `machine`, as the broker makes them.
    func change(_ machine: inout AccountMachine, serial: Int, now: Date, using generator: inout SeededGenerator) {
        let running = machine.refreshSerial ?? serial
        let lifetime = Double(Int.random(in: -60...4000, using: &generator))
        switch Int.random(in: 0..<10, using: &generator) {
        case 0:
            _ = machine.beginRefresh(serial: serial, forClient: Bool.random(using: &generator))
        case 1:
            let grant = Grant(token: token(at: now, lifetime: lifetime), refreshToken: try! SecretBytes("rt-\(serial)"))
            _ = machine.refreshSucceeded(
                serial: running, presented: machine.record.secrets, grant: grant, planner: planner, now: now)
        case 2:
            _ = machine.refreshFailed(serial: running, message: "HTTP 503", delay: 30, probeDelay: 5, now: now)
        case 3:
            _ = machine.refreshDenied(serial: running, message: "invalid_grant", now: now)
        case 4 where !machine.isLoggingOut:
            var record = machine.record
            record.token = token(at: now, lifetime: lifetime)
            _ = machine.tokensReplaced(by: record, planner: planner, now: now)
        case 5 where !machine.isLoggingOut:
            _ = machine.beginLogout()
        case 6 where machine.isLoggingOut:
            if Bool.random(using: &generator) { machine.logoutRefused() } else { _ = machine.loggedOut() }
        case 7:
            _ = machine.poll(now: now)
        default:
            _ = machine.refreshIsDue(now: now, overdueThreshold: 60, spread: 5)
        }
    }

    var oauth2: ProviderConfig {
        ProviderConfig(
            OAuth2Settings(tokenEndpoint: URL(string: "https://idp.example/token"), clientID: "cli", clientAuth: .none))
    }

    func record(_ name: String, provider: ProviderConfig? = nil) -> AccountRecord {
        AccountRecord(
            name: name, provider: provider ?? oauth2, secrets: AccountSecrets(refreshToken: "rt-0"), token: nil,
            needsLogin: false, lastError: nil, lastRefreshAt: nil)
    }

    func token(at now: Date, lifetime: TimeInterval) -> AccessToken {
        AccessToken(
            value: try! SecretBytes("at-\(lifetime)"), type: "Bearer", expiresAt: now.addingTimeInterval(lifetime),
            obtainedAt: now)
    }
}
