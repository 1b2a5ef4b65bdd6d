import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// Owner operations: accounts added, given tokens, refreshed at once, logged out and removed.
extension Broker {
    /// Creates an account with `provider` (and the client secret given with it); an `oauth2`
    /// account given only a refresh token refreshes at once.
    public func add(
        _ account: AccountName, provider: ProviderConfig, clientSecret: SecretBytes?, tokens: TokenPush?
    ) throws(BrokerFailure) -> AccountSnapshot {
        try create(account, provider: provider, clientSecret: clientSecret) { record, now in
            if let tokens { apply(tokens, to: &record, now: now) }
        }
    }

    /// Creates an account with `provider` and the tokens `fill` puts into its record.
    package func create(
        _ account: AccountName, provider: ProviderConfig, clientSecret: SecretBytes?,
        filling fill: (inout AccountRecord, Date) -> Void
    ) throws(BrokerFailure) -> AccountSnapshot {
        guard !padlock.isLocked else { throw .locked }
        guard accounts[account.rawValue] == nil else { throw .accountExists(account) }
        let now = clock.now()
        var record = try Self.newRecord(account, provider: provider, clientSecret: clientSecret)
        fill(&record, now)
        return try serveNew(record, now: now)
    }

    /// A new account's record: `provider`, the client secret and a DPoP key when `provider`
    /// asks for one; no token yet.
    package static func newRecord(_ account: AccountName, provider: ProviderConfig, clientSecret: SecretBytes?)
        throws(BrokerFailure) -> AccountRecord
    {
        var record = AccountRecord(
            name: account.rawValue, provider: provider, secrets: AccountSecrets(clientSecret: clientSecret), token: nil,
            needsLogin: false, lastError: nil, lastRefreshAt: nil)
        try record.makeDPoPKeyIfWanted()
        return record
    }

    /// Starts serving a new account: its machine, its effects (the save among them, which a
    /// shared account's row takes instead), the log line and the `added` event.
    package func serveNew(_ record: AccountRecord, now: Date) throws(BrokerFailure) -> AccountSnapshot {
        let name = record.name
        try checkNotDamaged(name)
        var machine = AccountMachine(record: record, planner: planner, now: now)
        let effects = machine.tokensReplaced(by: record, planner: planner, now: now)
        accounts[name] = machine
        try run(effects, for: name)
        logger.info(
            "account added",
            metadata: [
                "account": "\(name)", "provider": "\(record.provider.kind)",
                "shared": "\(isShared(name))",
            ])
        let added = describe(try self.machine(name), now: clock.now())
        events.publish(AccountEvent(kind: .added, account: AccountName(known: name), at: now, state: added.state))
        return added
    }

    /// Replaces an account's tokens; clears a denial, a logout and any backoff.
    /// A shared account's are replaced fleet-wide (`replaceSharedTokens`).
    /// A client secret alone corrects the account's in place, as `update` does.
    public func setTokens(of account: AccountName, to tokens: TokenPush) async throws(BrokerFailure)
        -> AccountSnapshot
    {
        let machine = try machine(account.rawValue)
        if tokens.clientSecret != nil, !machine.record.provider.takesClientSecret {
            throw .invalid(
                "a \(machine.record.provider.kind) account has no client secret; push its tokens without one")
        }
        if tokens.isEmpty, let secret = tokens.clientSecret {
            return try await update(account, changes: [:], clientSecret: secret)
        }
        guard !tokens.isEmpty else { throw .nothingToPush }
        if isShared(account.rawValue) {
            return try await replaceSharedTokens(of: account) { record, now in apply(tokens, to: &record, now: now) }
        }
        return try replaceTokens(of: account) { record, now in apply(tokens, to: &record, now: now) }
    }

    /// Replaces an account's tokens with those `fill` puts into its record; clears a denial, a
    /// logout and any backoff.
    package func replaceTokens(of account: AccountName, filling fill: (inout AccountRecord, Date) -> Void)
        throws(BrokerFailure) -> AccountSnapshot
    {
        let name = account.rawValue
        var machine = try self.machine(name)
        try checkChangeable(machine)
        let now = clock.now()
        var record = machine.record
        fill(&record, now)
        try record.makeDPoPKeyIfWanted()
        let effects = machine.tokensReplaced(by: record, planner: planner, now: now)
        accounts[name] = machine
        try run(effects, for: name)
        cache.withdrawNarrowed(for: name)
        logger.info("tokens replaced", metadata: ["account": "\(name)"])
        return describe(try self.machine(name), now: clock.now())
    }

    /// Changes an account's provider settings (`changes`, fields of a `provider` object by their
    /// wire names; `null` removes one) and its client secret in place, checked as `add` checks
    /// them. Its tokens stay, unless the change would send its credential to another client or
    /// origin, which is refused with why. A change of a declared account's settings is refused
    /// (broker.toml holds them); its client secret may change. An account that holds a
    /// credential starts over, so the next refresh, due at once after a denial, uses the change.
    public func update(_ account: AccountName, changes: [String: JSONValue], clientSecret: SecretBytes?)
        async throws(BrokerFailure) -> AccountSnapshot
    {
        let name = account.rawValue
        let machine = try self.machine(name)
        try checkChangeable(machine)
        let record = machine.record
        guard !changes.isEmpty || clientSecret != nil else {
            throw .invalid("nothing to change: give a setting or a client secret")
        }
        if record.declared == true, !changes.isEmpty {
            let names = changes.keys.sorted().joined(separator: ", ")
            throw .invalid(
                "\(name) is declared in broker.toml: change \(names) in its table there, then run brokerctl reload "
                    + "(brokerctl update changes only the client secret of a declared account)")
        }
        guard let fields = record.provider.settings.fieldValues(changedBy: changes) else {
            throw .invalid(
                "the settings of a \(record.provider.kind) account cannot be changed in place; remove it and add it again"
            )
        }
        var spec = ProviderSpec(kind: record.provider.kind, fields)
        if let clientSecret { spec[ProviderField.clientSecret.name] = .string(clientSecret.text) }
        if clientSecret != nil, !record.provider.takesClientSecret {
            throw .invalid("a \(record.provider.kind) account has no client secret")
        }
        let provider = try ProviderConfig.checking(spec, holdsClientSecret: record.secrets.clientSecret != nil).0
        if record.holdsCredential, let move = record.provider.credentialMove(to: provider) {
            throw .credentialWouldMove(account, move: move)
        }
        let change = { (updated: inout AccountRecord, _: Date) in
            updated.provider = provider
            if let clientSecret { updated.secrets.clientSecret = clientSecret }
        }
        tokenProviders[name] = nil
        if isShared(name) { return try await replaceSharedTokens(of: account, filling: change) }
        var updating = machine
        var updated = record
        change(&updated, clock.now())
        let effects = updating.reconfigured(by: updated, planner: planner, now: clock.now())
        accounts[name] = updating
        try run(effects, for: name)
        cache.withdrawNarrowed(for: name)
        logger.info(
            "account updated",
            metadata: [
                "account": "\(name)", "fields": "\(changes.keys.sorted())", "client_secret": "\(clientSecret != nil)",
            ])
        return describe(try self.machine(name), now: clock.now())
    }

    /// Deletes an account and its secrets.
    public func remove(_ account: AccountName) async throws(BrokerFailure) {
        let name = account.rawValue
        if damaged[name] != nil { return try removeDamaged(account) }
        try checkChangeable(try machine(name))
        // A shared account is removed fleet-wide: its row first (docs/fleet.md).
        try await removeShared(name)
        guard let removed = accounts.removeValue(forKey: name) else { throw .noSuchAccount(account) }
        forgetShared(name)
        tokenProviders[name] = nil
        do {
            try persist(changing: [name])
        } catch {
            accounts[name] = removed
            throw error
        }
        cache.publish(nil, for: name)
        tokenFiles.update(name, token: nil, logger: logger)
        logger.info("account removed", metadata: ["account": "\(name)"])
        events.publish(AccountEvent(kind: .removed, account: account, at: clock.now()))
    }

    /// Refreshes now, ignoring the schedule and the limit on clients' refreshes (joins a refresh
    /// already under way): an owner operation, which only `admins` reach (docs/limits.md). A
    /// denial by a command that holds its own credential (`exec`) is lifted: it is asked again.
    public func refreshNow(_ account: AccountName) async throws(BrokerFailure) -> AccountSnapshot {
        let name = account.rawValue
        var machine = try self.machine(name)
        if machine.refusal == .denied, restoration(of: machine.record) == .askCommandAgain {
            let effects = machine.tokensReplaced(by: machine.record, planner: planner, now: clock.now())
            accounts[name] = machine
            try run(effects, for: name)
        }
        guard machine.refreshesOnItsOwn else { throw .neverRefreshes(account, kind: machine.record.provider.kind) }
        try checkCredentialUsable(machine)
        if case .failure(let error) = await refreshShared(name, forClient: false) { throw error }
        return describe(try self.machine(name), now: clock.now())
    }

    /// Logs an account out: revokes its credential at the IdP where the provider can, then
    /// discards every token and refresh credential; the account keeps its settings (and client
    /// secret) in state `logged_out` until new tokens are pushed. Refused while the IdP cannot
    /// be reached, unless `force`, so a credential is never left alive at the IdP by accident.
    public func logout(_ account: AccountName, force: Bool) async throws(BrokerFailure) -> LogoutOutcome {
        let name = account.rawValue
        var machine = try self.machine(name)
        try checkChangeable(machine)
        // From here, nothing else may change or refresh the account: `set_tokens` and `remove`
        // are refused, and no refresh starts, so the record after each await is this one.
        guard machine.beginLogout() else { return .alreadyLoggedOut }
        accounts[name] = machine
        // A refresh under way may rotate the credential: revoke the one it leaves behind.
        _ = await refreshTasks[name]?.task.value
        await takeChainTurn(name)
        defer { endChainTurn(name) }
        // A shared account logs out fleet-wide: its row's credential is revoked under its lease,
        // and the logged-out record is the row's next version (docs/fleet.md).
        let lease: SharedLease?
        do {
            lease = try await logoutLease(name)
        } catch {
            accounts[name]?.logoutRefused()
            throw error
        }
        let current: AccountRecord
        if let lease { current = Self.unmarked(lease.row.record) } else { current = try self.machine(name).record }

        var revoked = false
        let answer = await provider(for: current).revoke(current)
        switch answer.mapError(current.outsideText().clean) {
        case .success(let revocation):
            revoked = revocation == .revoked
        case .failure(let failure) where !force:
            accounts[name]?.logoutRefused()
            if lease != nil { await fleet?.store.release(name) }
            logger.warning(
                "logout refused: cannot revoke", metadata: ["account": "\(name)", "reason": "\(failure.message)"])
            let wait =
                failure.kind == .transient ? min(failure.retryAfter ?? settings.backoffBase, settings.backoffCap) : nil
            throw .revocationFailed(account, reason: failure.message, retryAfter: wait)
        case .failure(let failure):
            logger.warning(
                "forced logout without revocation", metadata: ["account": "\(name)", "reason": "\(failure.message)"])
        }

        // Discarded in memory even if the vault cannot be saved: a revoked token must not be served.
        guard let effects = accounts[name]?.loggedOut() else { throw .noSuchAccount(account) }
        try run(effects, for: name)
        if let lease, let record = accounts[name]?.record {
            await commitLogout(record, share: lease.row.share, over: lease.row.version)
        }
        logger.info("logged out", metadata: ["account": "\(name)", "revoked": "\(revoked)"])
        return revoked ? .revoked : .discarded
    }

    /// Puts pushed tokens into `record`: an access token without an expiry lives the default
    /// lifetime; a refresh token replaces the old one and its expiry.
    package func apply(_ tokens: TokenPush, to record: inout AccountRecord, now: Date) {
        if let access = tokens.access {
            let expiry = access.expiry ?? .after(settings.defaultLifetime)
            record.token = AccessToken(
                value: access.value, type: access.type, expiresAt: Bounds.date(expiry.date(receivedAt: now)),
                obtainedAt: now, idToken: access.idToken, scope: access.scope, pushed: true)
            record.grantedScope = access.scope
        }
        if let refreshToken = tokens.refreshToken {
            record.secrets.refreshToken = refreshToken
            record.secrets.refreshExpiresAt = tokens.refreshExpiry?.date(receivedAt: now)
        }
        if let refreshURL = tokens.refreshURL { record.secrets.refreshURL = refreshURL }
        if let clientSecret = tokens.clientSecret { record.secrets.clientSecret = clientSecret }
    }

    /// Puts the tokens a login obtained into `record`: they replace every token and refresh
    /// credential it held (a login without an id token leaves none). `dpopKey`, the key the
    /// login proved, is the one they are bound to.
    package func apply(_ grant: Grant, to record: inout AccountRecord, dpopKey: DPoPKey?) {
        if let dpopKey { record.secrets.dpopKey = dpopKey }
        record.token = grant.token
        record.grantedScope = grant.token.scope
        record.secrets.refreshToken = grant.refreshToken
        record.secrets.refreshExpiresAt = grant.refreshExpiresAt
        record.secrets.refreshURL = nil
    }
}
