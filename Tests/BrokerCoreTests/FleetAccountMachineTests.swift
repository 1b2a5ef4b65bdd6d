@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// A shared account's fleet side on its own: no actor, database, IdP or disk; time is a manual
/// clock that moves only when a test advances it.
@Suite struct FleetAccountMachineTests {
    let clock = TestClock()
    let share = "9f2c"

    /// The account "api" served from version 3 of its row, committed by host "b".
    func served() -> FleetAccountMachine {
        FleetAccountMachine(share: share, version: 3, committedBy: "b")
    }

    @Test func aLeaseTakenWithdrawsTheTokenAndBoundsTheCommitsRetries() {
        var machine = served()
        let until = clock.now().addingTimeInterval(30)
        let effects = machine.leaseTaken(until: until)
        #expect(effects == [.withdraw], "the IdP may revoke the token held")
        #expect(machine.holdsLease && machine.leaseUntil == until)
        #expect(machine.mayRetryCommit(after: 0.5, now: clock.now()))
        clock.advance(by: 29.6)
        #expect(!machine.mayRetryCommit(after: 0.5, now: clock.now()), "no retry past the lease's end")
    }

    @Test func aLeaseLostLeavesTheRowAsHeld() {
        var machine = served()
        _ = machine.leaseTaken(until: clock.now().addingTimeInterval(30))
        let effects = machine.leaseLost()
        #expect(effects == [])
        #expect(!machine.holdsLease && machine.version == 3 && machine.committedBy == "b")
        #expect(!machine.mayRetryCommit(after: 0.5, now: clock.now()))
    }

    @Test func anotherHostsLeaseStartsOneWaitThatLaterNoticesDoNotProlong() {
        var machine = served()
        let effects = machine.othersLease(refreshing: false, wait: 40, now: clock.now())
        #expect(effects == [.withdraw, .followLease])
        let until = clock.now().addingTimeInterval(40)
        #expect(machine.following == .init(leases: 1, version: 3, until: until))
        clock.advance(by: 10)
        let second = machine.othersLease(refreshing: false, wait: 40, now: clock.now())
        #expect(second == [.withdraw], "one wait")
        #expect(machine.following?.leases == 2 && machine.following?.until == until, "its deadline stays")
        machine.followEnded()
        #expect(machine.following == nil)
    }

    @Test func aWaitStartedKeepsItsTaskForClientsToWaitFor() {
        var machine = served()
        let idle = Task {}
        machine.followStarted(idle)
        #expect(machine.following == nil, "no wait runs: nothing to keep")
        _ = machine.othersLease(refreshing: false, wait: 40, now: clock.now())
        let waiting = Task {}
        machine.followStarted(waiting)
        #expect(machine.following?.task == waiting)
        #expect(machine.following?.leases == 1 && machine.following?.version == 3)
    }

    @Test func anotherHostsLeaseDuringARefreshHereOnlyWithdrawsTheToken() {
        var machine = served()
        let effects = machine.othersLease(refreshing: true, wait: 40, now: clock.now())
        #expect(effects == [.withdraw])
        #expect(machine.following == nil, "the refresh reads the row on its own")
    }

    @Test func aCommitLandedTakesTheNextVersionAndEndsTheLease() {
        var machine = served()
        _ = machine.leaseTaken(until: clock.now().addingTimeInterval(30))
        let effects = machine.commitLanded(over: 3, by: "a")
        #expect(effects == [])
        #expect(machine.version == 4 && machine.committedBy == "a" && !machine.holdsLease)
    }

    @Test func aCommitThatLandsAfterTheLeaseLapsedIsTakenAllTheSame() {
        var machine = served()
        _ = machine.leaseTaken(until: clock.now().addingTimeInterval(5))
        clock.advance(by: 10)
        #expect(!machine.mayRetryCommit(after: 0.5, now: clock.now()), "the lease lapsed")
        // Its compare and swap found the row still at version 3: the commit is the row now.
        let effects = machine.commitLanded(over: 3, by: "a")
        #expect(effects == [])
        #expect(machine.version == 4 && machine.committedBy == "a" && !machine.holdsLease)
        #expect(machine.pending == nil && machine.vaultCopy == nil)
    }

    @Test func aCommitFailedIsKeptInTheVaultAndRetried() throws {
        var machine = served()
        _ = machine.leaseTaken(until: clock.now().addingTimeInterval(30))
        let rotated = AccountRecord.sample("api")
        let effects = machine.commitFailed(keeping: rotated, share: share, over: 3)
        #expect(effects == [.persist, .retryCommit])
        #expect(machine.pending == .init(record: rotated, share: share, over: 3) && !machine.holdsLease)
        let kept = try #require(machine.vaultCopy)
        #expect(kept.fleet == FleetMark(step: .uncommitted, version: 3, id: share))
        #expect(kept.secrets == rotated.secrets, "the rotated credential")
    }

    @Test func aPendingCommitDroppedLeavesTheVaultOnlyForItsOwnVersion() {
        var machine = served()
        _ = machine.commitFailed(keeping: .sample("api"), share: share, over: 3)
        let effects = machine.pendingDropped(over: 2)
        #expect(effects == [], "another commit's")
        #expect(machine.pending != nil)
        let second = machine.pendingDropped(over: 3)
        #expect(second == [.persist])
        #expect(machine.pending == nil && machine.vaultCopy == nil)
    }

    @Test func aRowThatMovedOnIsTakenUnlessOfAnotherShareOrBehindAPendingCommit() {
        var machine = served()
        let effects = machine.rowMovedOn(share: "other", version: 9, by: "c")
        #expect(!effects, "another account of that name")
        let second = machine.rowMovedOn(share: share, version: 5, by: "c")
        #expect(second)
        #expect(machine.version == 5 && machine.committedBy == "c")
        _ = machine.commitFailed(keeping: .sample("api"), share: share, over: 5)
        let third = machine.rowMovedOn(share: share, version: 6, by: "b")
        #expect(!third, "the pending commit settles first")
        let fourth = machine.rowReadInRefresh(share: share, version: 6, by: "b")
        #expect(fourth, "a refresh goes on from the row")
        #expect(machine.version == 6 && machine.committedBy == "b")
    }

    @Test func aRollbackSeenChangesNothing() {
        var machine = served()
        let effects = machine.rowMovedOn(share: share, version: 2, by: "c")
        #expect(!effects)
        let second = machine.rowMovedOn(share: share, version: 3, by: "c")
        #expect(!second, "the version held")
        let third = machine.rowReadInRefresh(share: share, version: 1, by: "c")
        #expect(!third)
        #expect(machine.version == 3 && machine.committedBy == "b")
    }

    @Test func aCommitTakenSinceTheLastLeaseNoticeEndsTheWait() {
        var machine = served()
        _ = machine.othersLease(refreshing: false, wait: 40, now: clock.now())
        #expect(machine.followIsCurrent)
        _ = machine.rowMovedOn(share: share, version: 4, by: "c")
        #expect(!machine.followIsCurrent)
    }

    @Test func anUnshareKeepsTheRowsRecordMarkedUntilItSettles() throws {
        var machine = served()
        let record = AccountRecord.sample("api")
        let effects = machine.unsharing(record, at: 3)
        #expect(effects == [.persist])
        #expect(try #require(machine.vaultCopy).fleet == FleetMark(step: .unsharing, version: 3))
        let second = machine.unsharingAbandoned()
        #expect(second == [.persist], "the row moved on: the copy goes")
        #expect(machine.vaultCopy == nil)
        _ = machine.unsharing(record, at: 3)
        let third = machine.unshared()
        #expect(third == [.forget], "the local account replaces the copy")
        #expect(machine.vaultCopy == nil)
    }

    @Test func aRemovedAccountIsForgottenWithTheCommitItKept() {
        var plain = served()
        let effects = plain.removed(refreshing: false)
        #expect(effects == [.forget])
        var keeping = served()
        _ = keeping.commitFailed(keeping: .sample("api"), share: share, over: 3)
        let second = keeping.removed(refreshing: false)
        #expect(second == [.forget, .persist], "no row will take it")
        #expect(keeping.vaultCopy == nil)
    }

    @Test func anUnshareDuringARefreshWaitsForTheRefresh() {
        var machine = served()
        _ = machine.leaseTaken(until: clock.now().addingTimeInterval(30))
        _ = machine.othersLease(refreshing: true, wait: 40, now: clock.now())
        // Another host unshared the account: its row is gone while the refresh here runs.
        let effects = machine.removed(refreshing: true)
        #expect(effects == [], "the refresh reads the row on its own")
        #expect(machine.holdsLease && machine.version == 3)
        clock.advance(by: 2)
        _ = machine.leaseLost()
        let second = machine.removed(refreshing: false)
        #expect(second == [.forget], "the next read of the store drops it")
    }

    @Test func aCommitKeptAcrossARestartIsRetriedBeforeTheAccountIsServed() throws {
        var marked = AccountRecord.sample("api")
        let mark = FleetMark(step: .uncommitted, version: 7, id: share)
        marked.fleet = mark
        let machine = FleetAccountMachine(keptCommit: marked, mark: mark)
        #expect(!machine.served && machine.share == share && machine.version == 7)
        #expect(machine.pending?.record.fleet == nil && machine.pending?.over == 7)
        #expect(try #require(machine.vaultCopy) == marked, "the vault keeps it as it was")
    }
}
