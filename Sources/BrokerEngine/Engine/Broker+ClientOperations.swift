import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// Client operations: tokens and what `status` shows; any local caller the access rules allow.
extension Broker {
    /// A token valid for `minTTL` seconds, refreshing (once, shared) when the cached one falls short.
    ///
    /// Waits for the refresh off the actor: when it ends, every caller waiting for it (a
    /// thousand clients of an expired token) takes its token from the cache in parallel, none
    /// queued behind the others on the actor.
    public nonisolated func token(for account: AccountName, minTTL: TimeInterval) async throws(BrokerFailure)
        -> PreparedToken
    {
        let name = account.rawValue
        if let token = cache.token(for: name, minTTL: minTTL, now: clock.now()) { return token }
        // Another host leased this shared account: its commit or release comes first.
        if let lease = await leaseFollowed(name) {
            await lease.value
            if let token = cache.token(for: name, minTTL: minTTL, now: clock.now()) { return token }
        }
        switch try await refreshForToken(name, minTTL: minTTL) {
        case .ready(let token):
            return token
        case .refreshing(let refresh, let source):
            let outcome = await refresh.value
            if let token = cache.token(for: name, minTTL: minTTL, now: clock.now()) { return token }
            if case .failure(let error) = outcome { throw error }
            throw await shortfall(name, heldBy: source, minTTL: minTTL)
        }
    }

    /// Why the token `source` holds for `name` after a refresh falls short of `minTTL`: the
    /// lifetime the IdP grants, when it issued the token just now, so the caller learns what
    /// it may ask for.
    package func shortfall(_ name: String, heldBy source: BrokerFailure.TokenSource, minTTL: TimeInterval)
        -> BrokerFailure
    {
        guard source == .issued, let token = accounts[name]?.record.token, token.pushed != true else {
            return .tokenTooShort(heldBy: source, minTTL: minTTL)
        }
        return .lifetimeTooShort(lifetime: token.expiresAt.timeIntervalSince(token.obtainedAt), minTTL: minTTL)
    }

    /// What a `token` call for `name` that missed the cache gets on the actor.
    package enum TokenWait {
        /// A refresh that ended since the call looked filled the cache.
        case ready(PreparedToken)
        /// The refresh to wait for (joined if one is under way), and what holds the tokens.
        case refreshing(Task<Result<Void, BrokerFailure>, Never>, BrokerFailure.TokenSource)
    }

    /// The token, or the refresh a `token` call for `name` waits for; refuses an account that
    /// cannot give a token for `minTTL`. Looks at the cache again first, on the actor, so a
    /// call that missed it just before a refresh ended does not start another.
    package func refreshForToken(_ name: String, minTTL: TimeInterval) throws(BrokerFailure) -> TokenWait {
        if let token = cache.token(for: name, minTTL: minTTL, now: clock.now()) { return .ready(token) }
        let machine = try self.machine(name)
        try checkRefreshable(machine)
        try checkLifetime(machine, covers: minTTL)
        if let held = try tokenInsteadOfRefresh(machine) { return .ready(held) }
        let source: BrokerFailure.TokenSource =
            machine.record.provider.renewal.watchesSource ? .watched(kind: machine.record.provider.kind) : .issued
        return .refreshing(startRefresh(name, forClient: true), source)
    }

    /// Handles a token a resource server refused: refreshes once if it is still current (unless
    /// a client's request refreshed the account within `minimumRefreshInterval`), otherwise
    /// returns the newer token at once. While another host holds a shared account's lease, its
    /// commit is waited for as `token` does.
    public func reject(_ accessToken: SecretBytes, of account: AccountName, minTTL: TimeInterval)
        async throws(BrokerFailure) -> PreparedToken
    {
        let name = account.rawValue
        let machine = try self.machine(name)
        guard machine.record.token?.value == accessToken, leaseFollowed(name) == nil else {
            return try await token(for: account, minTTL: minTTL)
        }
        try checkRefreshable(machine)
        if let held = try tokenInsteadOfRefresh(machine) { return held }
        let outcome = await refreshShared(name, forClient: true)
        if case .failure(let error) = outcome { throw error }
        return try await token(for: account, minTTL: minTTL)
    }

    /// Where one account stands.
    public func snapshot(of account: AccountName) throws(BrokerFailure) -> AccountSnapshot {
        if let damaged = damaged[account.rawValue] { return describe(damaged.record, since: damaged.since) }
        return describe(try machine(account.rawValue), now: clock.now())
    }

    /// Where every account stands, sorted by name: the damaged records among them.
    public func snapshots() -> [AccountSnapshot] {
        let now = clock.now()
        let served = accounts.machines.values.map { describe($0, now: now) }
        let kept = damaged.values.map { describe($0.record, since: $0.since) }
        return (served + kept).sorted { $0.name < $1.name }
    }

    /// A one-line summary such as "5 accounts: 4 valid, 1 needs login" (systemd `STATUS=`).
    public func summary() -> String {
        if padlock.isLocked { return "locked (run brokerctl unlock)" }
        // Counts kept as the accounts change: the text costs the same however many there are.
        var counts = accounts.stateCounts(now: clock.now())
        if !damaged.isEmpty { counts[.damaged] = damaged.count }
        let total = accounts.count + damaged.count
        let noun = total == 1 ? "account" : "accounts"
        guard !counts.isEmpty else { return "0 accounts" }
        let parts = counts.map { ($0.key.rawValue, $0.value) }.sorted { $0.0 < $1.0 }.map {
            "\($0.1) \($0.0.replacing("_", with: " "))"
        }
        return "\(total) \(noun): " + parts.joined(separator: ", ")
    }

    /// A token answer for `account`'s id token, valid for `minTTL` seconds when its payload
    /// states an expiry. The access token is obtained first, as `token` does (a due refresh
    /// runs, and may bring a new id token); an id token still too short forces one refresh.
    public nonisolated func idToken(for account: AccountName, minTTL: TimeInterval) async throws(BrokerFailure)
        -> (idToken: SecretBytes, expiresAt: Date?)
    {
        _ = try await token(for: account, minTTL: minTTL)
        var held = try await heldIDToken(account)
        var expiry = IDToken.expiry(of: held.text)
        if let shortExpiry = expiry, shortExpiry < clock.now().addingTimeInterval(minTTL) {
            if let wait = try await refreshForIDToken(account) {
                // Refreshed too recently to refresh again: the id token held, while it lasts.
                guard shortExpiry > clock.now() else { throw .refreshTooSoon(account, retryAfter: wait) }
                return (held, Bounds.date(shortExpiry))
            }
            held = try await heldIDToken(account)
            expiry = IDToken.expiry(of: held.text)
            if let renewed = expiry, renewed < clock.now().addingTimeInterval(minTTL) {
                throw .idTokenExpired(account)
            }
        }
        return (held, expiry.map(Bounds.date))
    }

    /// Refreshes `account` because the id token it holds falls short, unless the last refresh a
    /// client's request started was within `minimumRefreshInterval`: then returns how long
    /// until one may.
    package func refreshForIDToken(_ account: AccountName) async throws(BrokerFailure) -> TimeInterval? {
        let machine = try self.machine(account.rawValue)
        guard machine.refreshesOnItsOwn else { throw .idTokenExpired(account) }
        try checkRefreshable(machine)
        if let wait = machine.clientRefreshWait(interval: settings.minimumRefreshInterval, now: clock.now()) {
            return wait
        }
        if case .failure(let error) = await refreshShared(account.rawValue, forClient: true) { throw error }
        return nil
    }

    /// The id token `account` holds.
    package func heldIDToken(_ account: AccountName) throws(BrokerFailure) -> SecretBytes {
        guard let idToken = try machine(account.rawValue).servableToken?.idToken else {
            throw .noIDToken(account)
        }
        return idToken
    }

    /// What a client's request that would refresh `machine` gets instead within
    /// `minimumRefreshInterval` of the last refresh a client's request started
    /// (docs/limits.md): the token held while it has not expired, else `refreshTooSoon`. `nil`: the
    /// refresh may start (or join the one under way).
    package func tokenInsteadOfRefresh(_ machine: AccountMachine) throws(BrokerFailure) -> PreparedToken? {
        let now = clock.now()
        guard let wait = machine.clientRefreshWait(interval: settings.minimumRefreshInterval, now: now) else {
            return nil
        }
        if let held = cache.token(for: machine.record.name, minTTL: 0, now: now), held.expiresAt > now { return held }
        throw .refreshTooSoon(AccountName(known: machine.record.name), retryAfter: wait)
    }
}
