@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// The account state machine on its own: no actor, clock, IdP or disk. Times are plain dates
/// and the planner has no jitter, so every schedule is exact.
@Suite struct AccountMachineTests {
    let start = Date(timeIntervalSince1970: 1_800_000_000)
    let planner = RefreshPlanner.withoutJitter

    func token(_ value: String, at now: Date, lifetime: TimeInterval = 3600) -> AccessToken {
        AccessToken(
            value: try! SecretBytes(value), type: "Bearer", expiresAt: now.addingTimeInterval(lifetime), obtainedAt: now
        )
    }

    func record(provider: ProviderConfig? = nil, token: AccessToken? = nil) -> AccountRecord {
        let oauth2 = ProviderConfig(
            OAuth2Settings(
                tokenEndpoint: URL(string: "https://idp.example/token"), clientID: "cli", clientAuth: .none))
        return AccountRecord(
            name: "api", provider: provider ?? oauth2, secrets: AccountSecrets(refreshToken: "rt-1"), token: token,
            needsLogin: false, lastError: nil, lastRefreshAt: nil)
    }

    func machine(token: AccessToken? = nil) -> AccountMachine {
        AccountMachine(record: record(token: token ?? self.token("at-1", at: start)), planner: planner, now: start)
    }

    func grant(_ value: String, rotated: String?, at now: Date) -> Grant {
        Grant(token: token(value, at: now), refreshToken: rotated.map { try! SecretBytes($0) })
    }

    // MARK: Start

    @Test func aLoadedRecordStartsInThePhaseItsFlagsSay() {
        var denied = record(token: token("at", at: start))
        denied.needsLogin = true
        var loggedOut = record()
        loggedOut.loggedOut = true
        #expect(AccountMachine(record: record(), planner: planner, now: start).phase == .idle)
        #expect(AccountMachine(record: denied, planner: planner, now: start).phase == .denied)
        #expect(AccountMachine(record: denied, planner: planner, now: start).nextRefreshAt == nil)
        #expect(AccountMachine(record: loggedOut, planner: planner, now: start).phase == .loggedOut)
    }

    @Test func aValidTokenIsRefreshedWhenAQuarterOfItsLifetimeRemains() {
        let machine = machine()
        #expect(machine.nextRefreshAt == start.addingTimeInterval(2700))
        #expect(machine.state(now: start) == .valid)
        #expect(machine.servableToken?.value == "at-1")
    }

    @Test func aStaticAccountNeverRefreshesAndNeedsLoginOnceItsTokenExpires() {
        let machine = AccountMachine(
            record: record(provider: ProviderConfig(StaticSettings()), token: token("pushed", at: start)),
            planner: planner, now: start)
        #expect(!machine.refreshesOnItsOwn)
        #expect(machine.nextRefreshAt == nil)
        #expect(machine.state(now: start) == .valid)
        #expect(machine.state(now: start.addingTimeInterval(3601)) == .needsLogin)
    }

    // MARK: Refreshes

    @Test func aSuccessfulRefreshSavesBeforeItServesAndSchedulesTheNext() {
        var machine = machine()
        let began = machine.beginRefresh(serial: 1)
        #expect(began)
        #expect(machine.phase == .refreshing(serial: 1))
        #expect(machine.nextRefreshAt == nil)
        #expect(machine.state(now: start) == .refreshing)
        let began2 = machine.beginRefresh(serial: 2)
        #expect(!began2)

        let now = start.addingTimeInterval(2700)
        let result = machine.refreshSucceeded(
            serial: 1, presented: machine.record.secrets, grant: grant("at-2", rotated: "rt-2", at: now),
            planner: planner, now: now)
        #expect(result == .applied([.persist, .publish(token("at-2", at: now)), .emit(.refreshed)]))
        #expect(machine.phase == .idle)
        #expect(machine.record.secrets.refreshToken == "rt-2")
        #expect(machine.record.lastRefreshAt == now)
        #expect(machine.nextRefreshAt == now.addingTimeInterval(2700))
    }

    @Test func aRefreshIsNeverScheduledSoonerThanTheMinimumInterval() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        let expired = Grant(token: token("at-2", at: start, lifetime: 0))
        _ = machine.refreshSucceeded(
            serial: 1, presented: machine.record.secrets, grant: expired, planner: planner, now: start)
        #expect(machine.nextRefreshAt == start.addingTimeInterval(planner.settings.minimumRefreshInterval))
    }

    @Test func transientFailuresBackOffAndOnlyTheFirstIsAnnounced() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        let first = machine.refreshFailed(serial: 1, message: "timed out", delay: 4, probeDelay: 2, now: start)
        #expect(first == .applied([.emit(.refreshFailed, message: "timed out")]))
        #expect(machine.phase == .backingOff(until: start.addingTimeInterval(4), probeAt: start.addingTimeInterval(2)))
        #expect(machine.nextRefreshAt == start.addingTimeInterval(4))
        #expect(machine.probeWait(now: start.addingTimeInterval(0.5)) == 1.5)
        #expect(machine.probeWait(now: start.addingTimeInterval(2)) == nil, "a client may try the IdP again")
        #expect(machine.probeWait(now: start.addingTimeInterval(5)) == nil)
        #expect(machine.state(now: start) == .stale)
        #expect(machine.state(now: start.addingTimeInterval(4000)) == .unavailable)

        let began = machine.beginRefresh(serial: 2)
        #expect(began)
        let failure = machine.refreshFailed(serial: 2, message: "timed out", delay: 8, probeDelay: 2, now: start)
        #expect(failure == .applied([]))
        #expect(machine.failures == 2)

        let began2 = machine.beginRefresh(serial: 3)
        #expect(began2)
        let now = start.addingTimeInterval(10)
        let success = machine.refreshSucceeded(
            serial: 3, presented: machine.record.secrets, grant: grant("at-2", rotated: nil, at: now),
            planner: planner, now: now)
        // The first success after failures says the account is usable again.
        #expect(success == .applied([.persist, .publish(token("at-2", at: now)), .emit(.refreshed), .emit(.valid)]))
        #expect(machine.failures == 0)
        #expect(machine.record.lastError == nil)
        #expect(machine.state(now: now) == .valid)
    }

    @Test func aDenialDuringBackoffStopsEveryRefreshUntilNewTokens() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        _ = machine.refreshFailed(serial: 1, message: "503", delay: 2, probeDelay: 2, now: start)
        _ = machine.beginRefresh(serial: 2)
        let denial = machine.refreshDenied(serial: 2, message: "invalid_grant", now: start)
        #expect(denial == .applied([.publish(nil), .emit(.needsLogin, message: "invalid_grant"), .persist]))
        #expect(machine.phase == .denied)
        #expect(machine.nextRefreshAt == nil)
        #expect(machine.refusal == .denied)
        #expect(machine.servableToken == nil)
        #expect(machine.state(now: start) == .needsLogin)
        let began = machine.beginRefresh(serial: 3)
        #expect(!began)
        let due = machine.refreshIsDue(now: start.addingTimeInterval(9999), overdueThreshold: 5, spread: 0)
        #expect(!due)
        #expect(machine.wakeAt == nil)

        var pushed = machine.record
        pushed.token = token("at-new", at: start)
        let effects = machine.tokensReplaced(by: pushed, planner: planner, now: start)
        #expect(effects == [.persist, .publish(token("at-new", at: start)), .emit(.valid)])
        #expect(machine.phase == .idle)
        #expect(machine.refusal == nil)
        #expect(machine.failures == 0)
        #expect(machine.record.lastError == nil)
    }

    @Test func aRefreshOvertakenByNewTokensKeepsOnlyTheCredentialItConsumed() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        let presented = machine.record.secrets

        // set_tokens pushes an access token only: the refresh token the refresh presented stays.
        var pushed = machine.record
        pushed.token = token("at-pushed", at: start)
        _ = machine.tokensReplaced(by: pushed, planner: planner, now: start)
        #expect(machine.phase == .idle)
        let late = machine.refreshSucceeded(
            serial: 1, presented: presented, grant: grant("at-late", rotated: "rt-2", at: start), planner: planner,
            now: start)
        #expect(late == .overtaken([.persist]))
        #expect(machine.record.secrets.refreshToken == "rt-2")
        #expect(machine.record.token?.value.text == "at-pushed")
        #expect(machine.phase == .idle)

        // A newly pushed refresh token is not replaced by what an older refresh rotated.
        _ = machine.beginRefresh(serial: 2)
        var replaced = machine.record
        replaced.secrets.refreshToken = "rt-pushed"
        _ = machine.tokensReplaced(by: replaced, planner: planner, now: start)
        let stale = machine.refreshSucceeded(
            serial: 2, presented: presented, grant: grant("at-x", rotated: "rt-3", at: start), planner: planner,
            now: start)
        #expect(stale == .overtaken([]))
        #expect(machine.record.secrets.refreshToken == "rt-pushed")
        let denial = machine.refreshDenied(serial: 2, message: "late", now: start)
        #expect(denial == .overtaken([]))
        let failure = machine.refreshFailed(serial: 2, message: "late", delay: 1, probeDelay: 1, now: start)
        #expect(failure == .overtaken([]))
        #expect(machine.phase == .idle)
    }

    @Test func validIsAnnouncedOnceWhenADeniedAccountServesAgain() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        _ = machine.refreshDenied(serial: 1, message: "invalid_grant", now: start)
        // A refresh token alone, the old access token expired: usable only after the refresh.
        let later = start.addingTimeInterval(7200)
        var pushed = machine.record
        pushed.secrets.refreshToken = SecretBytes("rt-new")
        let effects = machine.tokensReplaced(by: pushed, planner: planner, now: later)
        #expect(!effects.contains(.emit(.valid)) && effects.contains(.refresh))
        _ = machine.beginRefresh(serial: 2)
        let success = machine.refreshSucceeded(
            serial: 2, presented: machine.record.secrets, grant: grant("at-2", rotated: "rt-2", at: later),
            planner: planner, now: later)
        #expect(success == .applied([.persist, .publish(token("at-2", at: later)), .emit(.refreshed), .emit(.valid)]))
        _ = machine.beginRefresh(serial: 3)
        let next = machine.refreshSucceeded(
            serial: 3, presented: machine.record.secrets, grant: grant("at-3", rotated: "rt-3", at: later),
            planner: planner, now: later)
        #expect(next == .applied([.persist, .publish(token("at-3", at: later)), .emit(.refreshed)]))

        // New tokens for a usable account announce nothing.
        var again = machine.record
        again.token = token("at-pushed", at: later)
        #expect(!machine.tokensReplaced(by: again, planner: planner, now: later).contains(.emit(.valid)))
    }

    @Test func newTokensThatAreAlreadyDueAskForARefresh() {
        var machine = machine()
        var pushed = machine.record
        let expired = token("expired", at: start.addingTimeInterval(-100), lifetime: 50)
        pushed.token = expired
        let effects = machine.tokensReplaced(by: pushed, planner: planner, now: start)
        #expect(effects == [.persist, .publish(expired), .refresh])
    }

    @Test func whatAFailedSaveHeldBackIsRunOnceASaveSucceedsAndNoRefreshIsScheduledForIt() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        let result = machine.refreshSucceeded(
            serial: 1, presented: machine.record.secrets, grant: grant("at-2", rotated: "rt-2", at: start),
            planner: planner, now: start)
        guard case .applied(let effects) = result else { Issue.record("not applied"); return }
        let held = Array(effects.drop { $0 != .persist }.dropFirst())
        let scheduled = machine.nextRefreshAt
        machine.saveFailed(holding: held)
        #expect(machine.nextRefreshAt == scheduled, "the save is retried, not the refresh")
        #expect(held.contains(.publish(machine.record.token)))
        #expect(machine.saved() == held)
        #expect(machine.saved().isEmpty, "run once")
    }

    // MARK: Schedule and clock

    @Test func theSchedulerStartsWhatIsDueAndWaitsForTheRest() {
        var machine = machine()
        let scheduled = start.addingTimeInterval(2700)
        let before = machine.refreshIsDue(now: start, overdueThreshold: 5, spread: 10)
        #expect(!before)
        #expect(machine.wakeAt == scheduled)
        let atTime = machine.refreshIsDue(now: scheduled, overdueThreshold: 5, spread: 10)
        #expect(atTime)
        _ = machine.beginRefresh(serial: 1)
        let whileRefreshing = machine.refreshIsDue(now: scheduled, overdueThreshold: 5, spread: 10)
        #expect(!whileRefreshing)
        #expect(machine.wakeAt == nil)
    }

    @Test func aClockJumpPastTheScheduleSpreadsTheRefreshOnce() {
        var machine = machine()
        let afterJump = start.addingTimeInterval(3 * 3600)
        let due = machine.refreshIsDue(now: afterJump, overdueThreshold: 5, spread: 7)
        #expect(!due)
        #expect(machine.nextRefreshAt == afterJump.addingTimeInterval(7))
        #expect(machine.wakeAt == afterJump.addingTimeInterval(7))
        // Still late when next looked at (the clock jumped again): it runs now, it is not pushed back twice.
        let later = afterJump.addingTimeInterval(60)
        let due2 = machine.refreshIsDue(now: later, overdueThreshold: 5, spread: 7)
        #expect(due2)
        let began = machine.beginRefresh(serial: 1)
        #expect(began)
        _ = machine.refreshSucceeded(
            serial: 1, presented: machine.record.secrets, grant: grant("at-2", rotated: nil, at: later),
            planner: planner, now: later)
        // A new schedule can be spread again.
        let jumpAgain = later.addingTimeInterval(5 * 3600)
        let due3 = machine.refreshIsDue(now: jumpAgain, overdueThreshold: 5, spread: 3)
        #expect(!due3)
        #expect(machine.wakeAt == jumpAgain.addingTimeInterval(3))
    }

    @Test func aClockJumpBackwardsKeepsTheScheduleAndTheToken() {
        let machine = machine()
        let before = start.addingTimeInterval(-3600)
        #expect(machine.state(now: before) == .valid)
        var copy = machine
        let due = copy.refreshIsDue(now: before, overdueThreshold: 5, spread: 10)
        #expect(!due)
        #expect(copy.wakeAt == start.addingTimeInterval(2700))
    }

    // MARK: Logout

    @Test func aLogoutDiscardsEveryCredentialButTheClientSecret() {
        var record = record(token: token("at-1", at: start))
        record.secrets.clientSecret = "cs"
        var machine = AccountMachine(record: record, planner: planner, now: start)
        let loggingOut = machine.beginLogout()
        #expect(loggingOut)
        #expect(machine.refusal == .loggingOut)
        #expect(machine.nextRefreshAt == nil)
        let began = machine.beginRefresh(serial: 1)
        #expect(!began)
        let due = machine.refreshIsDue(now: start.addingTimeInterval(9999), overdueThreshold: 5, spread: 0)
        #expect(!due)
        #expect(machine.wakeAt == nil)

        let effects = machine.loggedOut()
        #expect(effects == [.publish(nil), .persist, .emit(.loggedOut)])
        #expect(machine.phase == .loggedOut)
        #expect(machine.record.secrets == AccountSecrets(clientSecret: "cs"))
        #expect(machine.record.token == nil)
        #expect(machine.refusal == .loggedOut)
        #expect(machine.state(now: start) == .loggedOut)
        let loggingOut2 = machine.beginLogout()
        #expect(!loggingOut2)
    }

    @Test func aRefusedLogoutLeavesTheAccountAsItWas() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        _ = machine.refreshFailed(serial: 1, message: "503", delay: 30, probeDelay: 2, now: start)
        let phase = machine.phase
        let next = machine.nextRefreshAt
        let loggingOut = machine.beginLogout()
        #expect(loggingOut)
        machine.logoutRefused()
        #expect(machine.phase == phase)
        #expect(machine.nextRefreshAt == next)
        #expect(machine.refusal == nil)
    }

    @Test func aLogoutDuringARefreshWaitsForItAndRevokesWhatItRotated() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        let loggingOut = machine.beginLogout()
        #expect(loggingOut)
        #expect(machine.refreshSerial == 1)
        #expect(machine.state(now: start) == .refreshing)

        let result = machine.refreshSucceeded(
            serial: 1, presented: machine.record.secrets, grant: grant("at-2", rotated: "rt-2", at: start),
            planner: planner, now: start)
        #expect(result == .applied([.persist, .publish(token("at-2", at: start)), .emit(.refreshed)]))
        // Still logging out, with the rotated credential there to be revoked; nothing scheduled.
        #expect(machine.phase == .loggingOut(refreshing: nil))
        #expect(machine.record.secrets.refreshToken == "rt-2")
        #expect(machine.nextRefreshAt == nil)

        // Refused: the refresh's outcome becomes the account's state.
        machine.logoutRefused()
        #expect(machine.phase == .idle)
        #expect(machine.nextRefreshAt == start.addingTimeInterval(2700))
    }

    @Test func aDenialWhileALogoutWaitsIsKeptIfTheLogoutIsRefused() {
        var machine = machine()
        _ = machine.beginRefresh(serial: 1)
        _ = machine.beginLogout()
        _ = machine.refreshDenied(serial: 1, message: "invalid_grant", now: start)
        #expect(machine.phase == .loggingOut(refreshing: nil))
        machine.logoutRefused()
        #expect(machine.phase == .denied)
        #expect(machine.refusal == .denied)
    }

    // MARK: Configuration

    @Test func aReloadReschedulesUnlessARefreshIsUnderWay() {
        var machine = machine()
        let sliding = ProviderConfig(
            SlidingSettings(endpoint: URL(string: "https://idp.example/keepalive")!, timeZone: "UTC"))
        let later = start.addingTimeInterval(100)
        machine.declared(provider: sliding, dropClientSecret: false, planner: planner, now: later)
        #expect(machine.record.provider == sliding)
        #expect(machine.record.declared == true)
        #expect(machine.nextRefreshAt == start.addingTimeInterval(2700))

        _ = machine.beginRefresh(serial: 1)
        machine.declared(
            provider: ProviderConfig(StaticSettings()), dropClientSecret: true, planner: planner, now: later)
        #expect(machine.nextRefreshAt == nil)
        #expect(machine.phase == .refreshing(serial: 1))
        machine.undeclared()
        #expect(machine.record.declared == false)
    }
}
