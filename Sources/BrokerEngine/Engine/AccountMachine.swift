import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// One account's lifecycle as a value: its vault record, its phase and its next refresh.
///
/// Every transition is a mutating function that returns the effects the engine must run, in
/// order (`Broker` runs them; the machine does no I/O, reads no clock and starts no task), in
/// the style of async-http-client's `HTTPConnectionPool.StateMachine`. A refresh is known by
/// the serial the engine gave it: a result whose serial is not the one under way (because
/// new tokens or a logout overtook it) changes nothing but a rotated credential.
///
/// One file for every transition: each must respect the same phases and serials, which a
/// reader checks only when they are side by side.
package struct AccountMachine: Sendable {
    /// Where the account is in its lifecycle.
    package enum Phase: Equatable, Sendable {
        /// Serving its token, if any, and waiting for `nextRefreshAt`.
        case idle
        /// A refresh is under way.
        case refreshing(serial: Int)
        /// Transient failures: the schedule tries again at `until`; a client's request fails
        /// fast until `probeAt`, and after it starts the refresh itself (docs/limits.md).
        case backingOff(until: Date, probeAt: Date)
        /// The IdP refused the credential; only new tokens bring the account back.
        case denied
        /// `logout` is revoking the credential; nothing else may change it meanwhile.
        /// `refreshing` is a refresh that started before and that the logout waits for.
        case loggingOut(refreshing: Int?)
        /// Every token was discarded; only new tokens bring the account back.
        case loggedOut
    }

    /// What the engine does after a transition, in the order given. A failed `persist` stops
    /// the effects after it.
    package enum Effect: Equatable, Sendable {
        /// Write the record to the vault, durably.
        case persist
        /// Serve this token from the cache (`nil`: serve none).
        case publish(AccessToken?)
        /// Tell subscribers.
        case emit(AccountEvent.Kind, message: String? = nil)
        /// Start a refresh now.
        case refresh
    }

    /// Why the account's credential cannot be used now.
    package enum Refusal: Equatable, Sendable {
        case loggedOut, denied, loggingOut
    }

    /// How a refresh's result was taken.
    package enum RefreshResult: Equatable, Sendable {
        /// The result is the account's new state.
        case applied([Effect])
        /// New tokens or a logout overtook the refresh; only a credential it rotated was kept.
        case overtaken([Effect])
    }

    private(set) var record: AccountRecord
    private(set) var phase: Phase
    /// When the next scheduled refresh starts; `nil` when none is scheduled.
    private(set) var nextRefreshAt: Date?
    /// Transient failures since the last success.
    private(set) var failures = 0
    /// Set when an overdue refresh was pushed back to spread a backlog; it runs when next due.
    private var spreadOverdue = false
    /// When the provider of a kind that watches its source is next asked whether it changed;
    /// `nil`: at the next pass.
    private var nextPollAt: Date?
    /// The phase and schedule a running logout replaced, restored if the logout is refused.
    private var beforeLogout: (phase: Phase, nextRefreshAt: Date?)?
    /// The serial of the refresh under way when a client's request started it (a `reject`, a
    /// token that fell short), not the schedule, new tokens or the owner.
    private var clientRefresh: Int?
    /// When the last refresh a client's request started ended with a token: another client's
    /// request starts none within `minimumRefreshInterval` of it (docs/limits.md).
    private var clientRefreshedAt: Date?
    /// Set when new tokens restored an account that was down (`isDown`) but could not serve yet
    /// (a refresh must come first): that refresh's success announces `valid`.
    private var owesValid = false
    /// What a refresh whose save failed did not run yet (its token served, its events): run
    /// once a save writes its record (`saved`), so nothing unsaved is served.
    private var heldUntilSaved: [Effect]?

    /// The machine of a record loaded from the vault or just created.
    package init(record: AccountRecord, planner: RefreshPlanner, now: Date) {
        self.record = record
        if record.loggedOut == true {
            phase = .loggedOut
        } else if record.needsLogin {
            phase = .denied
        } else {
            phase = .idle
        }
        nextRefreshAt = Self.schedule(record, planner, now: now)
    }

    // MARK: Questions

    /// When the scheduler must look at the account next (`due` and `poll`): its next refresh or
    /// the end of its backoff, or the next look at the source it watches; `nil`: neither.
    package var wakeAt: Date? {
        guard record.provider.renewal.watchesSource, refusal == nil else { return scheduledRefresh }
        let poll = nextPollAt ?? .distantPast
        return scheduledRefresh.map { min($0, poll) } ?? poll
    }

    /// When the scheduler starts the next refresh: `nextRefreshAt` in the phases it may start from.
    private var scheduledRefresh: Date? {
        switch phase {
        case .idle, .backingOff: return nextRefreshAt
        case .refreshing, .denied, .loggingOut, .loggedOut: return nil
        }
    }

    /// Whether the provider obtains tokens itself (a `static` account only serves pushed ones).
    package var refreshesOnItsOwn: Bool { record.provider.renewal != .pushedOnly }

    /// The serial of the refresh under way, if any (also while a logout waits for it).
    package var refreshSerial: Int? {
        switch phase {
        case .refreshing(let serial): return serial
        case .loggingOut(let serial): return serial
        case .idle, .backingOff, .denied, .loggedOut: return nil
        }
    }

    /// The token to serve, if the account may serve one.
    package var servableToken: AccessToken? {
        record.needsLogin || record.loggedOut == true ? nil : record.token
    }

    /// Whether a logout is running.
    package var isLoggingOut: Bool {
        if case .loggingOut = phase { return true }
        return false
    }

    /// Why the credential cannot be used, or `nil` when it can.
    package var refusal: Refusal? {
        if record.loggedOut == true { return .loggedOut }
        if record.needsLogin { return .denied }
        return isLoggingOut ? .loggingOut : nil
    }

    /// How long a client's request must wait before it may try the IdP during a backoff, or
    /// `nil` when it need not.
    package func probeWait(now: Date) -> TimeInterval? {
        guard case .backingOff(_, let probeAt) = phase, probeAt > now else { return nil }
        return probeAt.timeIntervalSince(now)
    }

    /// How long a refresh a client's request would start must still wait: until `interval`
    /// seconds after the last one a client's request started; `nil` when it need not (or a
    /// refresh is under way, which the request joins). Only kinds that refresh at an IdP or a
    /// helper wait (a `file` account's refresh reads a local file). A wall clock set back lets
    /// it through.
    package func clientRefreshWait(interval: TimeInterval, now: Date) -> TimeInterval? {
        guard record.provider.renewal == .refreshes, refreshSerial == nil, let clientRefreshedAt,
            now >= clientRefreshedAt
        else { return nil }
        let wait = interval - now.timeIntervalSince(clientRefreshedAt)
        return wait > 0 ? wait : nil
    }

    /// The state `status` shows.
    package func state(now: Date) -> AccountState {
        if record.loggedOut == true { return .loggedOut }
        if record.needsLogin { return .needsLogin }
        if refreshSerial != nil { return .refreshing }
        let valid = (record.token?.expiresAt ?? .distantPast) > now
        if !refreshesOnItsOwn { return valid ? .valid : .needsLogin }
        if valid { return failures > 0 ? .stale : .valid }
        return failures > 0 ? .unavailable : .refreshing
    }

    // MARK: Tokens pushed by a person

    /// Whether the account waits for its owner (`needs_login`, `logged_out`) or its refreshes
    /// are failing: becoming usable again is announced (`valid`, protocol/PROTOCOL.md).
    package func isDown(now: Date) -> Bool {
        failures > 0 || [.needsLogin, .loggedOut].contains(state(now: now))
    }

    /// New tokens (from `add`, `set_tokens` or a login) start the lifecycle over: no denial, no
    /// error, no backoff, and a refresh under way is abandoned. Not allowed while logging out.
    package mutating func tokensReplaced(by updated: AccountRecord, planner: RefreshPlanner, now: Date) -> [Effect] {
        precondition(!isLoggingOut, "tokens are not replaced while logging out")
        let wasDown = isDown(now: now)
        record = updated
        startOver(in: .idle)
        nextRefreshAt = Self.schedule(record, planner, now: now)
        let serves = state(now: now) == .valid
        owesValid = wasDown && !serves
        return [.persist, .publish(servableToken)] + (wasDown && serves ? [.emit(.valid)] : [])
            + (nextRefreshAt.map { $0 <= now } == true ? [.refresh] : [])
    }

    /// `update` changed the account's settings or client secret (`updated` holds them): an
    /// account with a credential starts over as with new tokens, so a denial is lifted and the
    /// next refresh uses the change; a logged-out one stays logged out, with nothing to refresh.
    package mutating func reconfigured(by updated: AccountRecord, planner: RefreshPlanner, now: Date) -> [Effect] {
        guard case .loggedOut = phase else { return tokensReplaced(by: updated, planner: planner, now: now) }
        record = updated
        return [.persist]
    }

    // MARK: Refreshes

    /// Starts refresh `serial`, from `idle` or `backingOff`, for a client's request when
    /// `forClient`; `false` in any other phase.
    package mutating func beginRefresh(serial: Int, forClient: Bool = false) -> Bool {
        switch phase {
        case .idle, .backingOff:
            phase = .refreshing(serial: serial)
            clientRefresh = forClient ? serial : nil
            nextRefreshAt = nil
            spreadOverdue = false
            return true
        case .refreshing, .denied, .loggingOut, .loggedOut:
            return false
        }
    }

    /// Refresh `serial` got `grant`. The rotated credential is kept even when the refresh was
    /// overtaken, as long as the account still holds the credential the refresh presented
    /// (`presented`), since presenting it consumed it.
    package mutating func refreshSucceeded(
        serial: Int, presented: AccountSecrets, grant: Grant, planner: RefreshPlanner, now: Date
    ) -> RefreshResult {
        guard refreshSerial == serial else { return .overtaken(keepRotated(grant, presented: presented)) }
        if record.provider.renewal.watchesSource, failures == 0, record.token == grant.token {
            // A watched source still holds the token already served: nothing to save or announce.
            if clientRefresh == serial { clientRefreshedAt = now }
            settle(.idle, nextRefreshAt: Self.next(after: record, planner, now: now))
            return .applied([])
        }
        // An answer without an id token keeps the one held (some IdPs send it only at login).
        var token = grant.token
        if token.idToken == nil { token.idToken = record.token?.idToken }
        record.token = token
        if let refreshToken = grant.refreshToken {
            // A rotated refresh token carries its own expiry (or none); the old one's no longer applies.
            record.secrets.refreshToken = refreshToken
            record.secrets.refreshExpiresAt = grant.refreshExpiresAt
        } else if let refreshExpiresAt = grant.refreshExpiresAt {
            record.secrets.refreshExpiresAt = refreshExpiresAt
        }
        if let refreshURL = grant.refreshURL { record.secrets.refreshURL = refreshURL }
        record.lastRefreshAt = now
        if clientRefresh == serial { clientRefreshedAt = now }
        record.lastError = nil
        let recovered = failures > 0 || owesValid
        failures = 0
        owesValid = false
        settle(.idle, nextRefreshAt: Self.next(after: record, planner, now: now))
        return .applied([.persist, .publish(token), .emit(.refreshed)] + (recovered ? [.emit(.valid)] : []))
    }

    /// Refresh `serial` of a shared account found the account's row newer than the record held:
    /// another host changed it (docs/fleet.md). The row's record replaces the one held (the row
    /// is the account's state, so nothing is saved here). When the row brings another token that
    /// needs no refresh yet (another host refreshed), the refresh ends, and `true` comes back with
    /// the effects; otherwise it goes on from the row's credential. A row that moved on with the
    /// same token (a scoped token's refresh rotated the credential) ends no refresh: the token
    /// held was due, or refused, all the same. `nil` when the refresh was overtaken.
    package mutating func sharedRowRead(_ row: AccountRecord, serial: Int, planner: RefreshPlanner, now: Date) -> (
        finished: Bool, effects: [Effect]
    )? {
        guard refreshSerial == serial else { return nil }
        let newToken = row.token != record.token
        record = row
        let next = Self.next(after: record, planner, now: now)
        let ended = record.needsLogin || record.loggedOut == true
        guard ended || (newToken && next.map { $0 > now } ?? true) else { return (false, [.publish(servableToken)]) }
        if clientRefresh == serial { clientRefreshedAt = now }
        return (true, settleOnRow(next: next, newToken: newToken))
    }

    /// A shared account's row, newer than the record held, read while no refresh runs here
    /// (another host's commit): the row's state is the account's. `nil` while a refresh runs.
    package mutating func sharedRowCommitted(_ row: AccountRecord, planner: RefreshPlanner, now: Date) -> [Effect]? {
        guard refreshSerial == nil, !isLoggingOut else { return nil }
        let newToken = row.token != record.token
        record = row
        return settleOnRow(next: Self.next(after: record, planner, now: now), newToken: newToken)
    }

    /// Marks the record with the share under way (`FleetMark`), or unmarks it once the share is
    /// settled with the account local (`nil`).
    package mutating func markForFleet(_ mark: FleetMark?) {
        record.fleet = mark
    }

    /// Settles on the row just taken: no failure, scheduled at `next` (denied or logged out when
    /// the row says so); announced as a refresh only when it brought another token. A row that
    /// moved on with the same token (a scoped token's refresh rotated the credential) leaves the
    /// account's state and schedule as they were.
    private mutating func settleOnRow(next: Date?, newToken: Bool) -> [Effect] {
        if record.needsLogin {
            failures = 0
            settle(.denied, nextRefreshAt: nil)
        } else if record.loggedOut == true {
            failures = 0
            settle(.loggedOut, nextRefreshAt: nil)
        } else if newToken {
            failures = 0
            settle(.idle, nextRefreshAt: next)
        }
        return [.publish(servableToken)] + (newToken ? [.emit(.refreshed, message: "refreshed by another host")] : [])
    }

    /// A narrowed refresh (`TokenKey`), which presented `presented`, got `grant`: the account
    /// keeps its own token and schedule, and a credential the IdP rotated replaces the one
    /// presented. `nil` when the account no longer holds that credential (new tokens came
    /// meanwhile), so the grant belongs to a chain it left.
    package mutating func narrowedRefreshSucceeded(presented: AccountSecrets, grant: Grant) -> [Effect]? {
        guard record.secrets.refreshToken == presented.refreshToken else { return nil }
        return keepRotated(grant, presented: presented)
    }

    /// The vault could not save what a refresh brought: `held`, the effects after the save,
    /// wait for a save that succeeds (the engine retries the save, not the refresh).
    package mutating func saveFailed(holding held: [Effect]) {
        heldUntilSaved = (heldUntilSaved ?? []) + held
    }

    /// A save wrote the record: the effects held back since a failed one, if any.
    package mutating func saved() -> [Effect] {
        defer { heldUntilSaved = nil }
        return heldUntilSaved ?? []
    }

    /// The IdP refused the credential refresh `serial` presented: stop until new tokens arrive.
    package mutating func refreshDenied(serial: Int, message: String, now: Date) -> RefreshResult {
        guard refreshSerial == serial else { return .overtaken([]) }
        record.needsLogin = true
        record.lastError = AccountError(code: "needs_login", message: message, at: now)
        settle(.denied, nextRefreshAt: nil)
        return .applied([.publish(nil), .emit(.needsLogin, message: message), .persist])
    }

    /// Refresh `serial` failed for a reason that may pass: the schedule backs off for `delay`
    /// seconds, clients' requests for `probeDelay` (`RefreshPlanner.probeDelay`, never longer).
    package mutating func refreshFailed(
        serial: Int, message: String, delay: TimeInterval, probeDelay: TimeInterval, now: Date
    ) -> RefreshResult {
        guard refreshSerial == serial else { return .overtaken([]) }
        failures += 1
        record.lastError = AccountError(code: "unavailable", message: message, at: now)
        let until = now.addingTimeInterval(delay)
        settle(.backingOff(until: until, probeAt: now.addingTimeInterval(probeDelay)), nextRefreshAt: until)
        return .applied(failures == 1 ? [.emit(.refreshFailed, message: message)] : [])
    }

    /// Whether the scheduler should start a refresh now; otherwise it looks again at `wakeAt`.
    /// A refresh found more than `overdueThreshold` seconds late (the machine slept, or the
    /// wall clock jumped) is moved `spread` seconds ahead once, so a backlog does not hit the
    /// IdPs in one instant. `spread` is asked for only then (a random draw is a system call).
    package mutating func refreshIsDue(
        now: Date, overdueThreshold: TimeInterval, spread: @autoclosure () -> TimeInterval
    )
        -> Bool
    {
        guard var due = scheduledRefresh else { return false }
        if !spreadOverdue, now.timeIntervalSince(due) > overdueThreshold {
            due = now.addingTimeInterval(spread())
            nextRefreshAt = due
            spreadOverdue = true
        }
        return due <= now
    }

    /// For a kind that watches its source: whether to ask the provider now if the source
    /// changed (once every poll interval, not while a refresh runs or the credential is
    /// refused); the next look is due at `wakeAt`. `false` for other kinds and refused credentials.
    package mutating func poll(now: Date) -> Bool {
        guard case .watches(let interval) = record.provider.renewal, refusal == nil else { return false }
        if let due = nextPollAt, due > now { return false }
        nextPollAt = now.addingTimeInterval(interval)
        return refreshSerial == nil
    }

    /// Polls again at the next pass (the provider was rebuilt, and knows nothing yet).
    package mutating func restartPolling() {
        nextPollAt = nil
    }

    // MARK: Logout

    /// Starts a logout; `false` when the account is already logged out. Not allowed while
    /// another logout runs. From here until `logoutRefused` or `loggedOut`, no refresh starts;
    /// one already under way still completes (`refreshSerial`), and the logout revokes what
    /// it leaves behind.
    package mutating func beginLogout() -> Bool {
        precondition(!isLoggingOut, "one logout at a time")
        if phase == .loggedOut { return false }
        // A refresh under way settles the phase to return to when it completes.
        beforeLogout = (refreshSerial == nil ? phase : .idle, nextRefreshAt)
        phase = .loggingOut(refreshing: refreshSerial)
        nextRefreshAt = nil
        return true
    }

    /// The IdP would not revoke: everything stays as it was before the logout.
    package mutating func logoutRefused() {
        guard let before = beforeLogout else { return }
        phase = before.phase
        nextRefreshAt = before.nextRefreshAt
        beforeLogout = nil
    }

    /// The credential was revoked (or the logout forced): every token and refresh credential
    /// is discarded; the settings, the client secret, the DPoP key (the next login binds its
    /// tokens to the same thumbprint) and the secrets of a later release stay.
    package mutating func loggedOut() -> [Effect] {
        record.secrets = AccountSecrets(
            clientSecret: record.secrets.clientSecret, dpopKey: record.secrets.dpopKey, unknown: record.secrets.unknown)
        record.token = nil
        startOver(in: .loggedOut)
        nextRefreshAt = nil
        // Withdrawn before the save: a revoked token is not served even if the save fails.
        return [.publish(nil), .persist, .emit(.loggedOut)]
    }

    // MARK: Configuration

    /// The config file (re)declares the account with `provider`. `dropClientSecret` when a
    /// logged-out account moves to another IdP, which did not issue its client secret.
    package mutating func declared(provider: ProviderConfig, dropClientSecret: Bool, planner: RefreshPlanner, now: Date)
    {
        if dropClientSecret { record.secrets.clientSecret = nil }
        record.provider = provider
        record.declared = true
        switch phase {
        case .idle, .backingOff, .denied, .loggedOut:
            nextRefreshAt = Self.schedule(record, planner, now: now)
        case .refreshing, .loggingOut:
            break
        }
    }

    /// The config file no longer declares the account: it stays, as a runtime account.
    package mutating func undeclared() {
        record.declared = false
    }

    // MARK: Helpers

    /// Begins the lifecycle again in `phase` (`idle` with new tokens, `loggedOut` with none):
    /// no denial, no error, no backoff, no logout under way, any refresh abandoned, and a
    /// client's request may refresh at once.
    private mutating func startOver(in phase: Phase) {
        record.needsLogin = false
        record.loggedOut = phase == .loggedOut ? true : nil
        record.lastError = nil
        failures = 0
        spreadOverdue = false
        beforeLogout = nil
        clientRefreshedAt = nil
        heldUntilSaved = nil
        self.phase = phase
    }

    /// Enters `phase` after a refresh, or records it as the phase to return to when a logout
    /// that waited for the refresh is refused.
    private mutating func settle(_ phase: Phase, nextRefreshAt: Date?) {
        if case .loggingOut = self.phase {
            self.phase = .loggingOut(refreshing: nil)
            beforeLogout = (phase, nextRefreshAt)
        } else {
            self.phase = phase
            self.nextRefreshAt = nextRefreshAt
        }
    }

    /// A refresh overtaken by new tokens (or a narrowed refresh) consumed the credential it
    /// presented; if the account still holds that now-dead credential, the rotated one replaces it.
    private mutating func keepRotated(_ grant: Grant, presented: AccountSecrets) -> [Effect] {
        var changed = false
        if let rotated = grant.refreshToken, record.secrets.refreshToken == presented.refreshToken {
            record.secrets.refreshToken = rotated
            record.secrets.refreshExpiresAt = grant.refreshExpiresAt
            changed = true
        }
        if let rotated = grant.refreshURL, record.secrets.refreshURL == presented.refreshURL {
            record.secrets.refreshURL = rotated
            changed = true
        }
        return changed ? [.persist] : []
    }

    /// When `record` refreshes next on its own: before expiry for kinds that refresh, at expiry
    /// for kinds that watch a source (their polls catch a renewed token sooner), never for
    /// pushed tokens or a credential that cannot be used.
    private static func schedule(_ record: AccountRecord, _ planner: RefreshPlanner, now: Date) -> Date? {
        if record.needsLogin || record.loggedOut == true { return nil }
        switch record.provider.renewal {
        case .pushedOnly: return nil
        case .refreshes:
            return planner.nextRefresh(token: record.token, refreshExpiresAt: record.secrets.refreshExpiresAt, now: now)
        case .watches: return max(record.token?.expiresAt ?? now, now)
        }
    }

    /// The schedule after a refresh: never sooner than the minimum interval, so an IdP issuing
    /// already-expired tokens is not called in a loop.
    private static func next(after record: AccountRecord, _ planner: RefreshPlanner, now: Date) -> Date? {
        schedule(record, planner, now: now).map {
            max($0, now.addingTimeInterval(planner.settings.minimumRefreshInterval))
        }
    }
}
