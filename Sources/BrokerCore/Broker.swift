import BrokerProtocol
import FoundationEssentials
import Logging
import Synchronization

/// The broker engine: owns every account, decides and runs refreshes (one at a time per
/// account), keeps the vault in step, and publishes servable tokens to `cache`.
public actor Broker {
    /// Tokens ready to serve, readable without entering the actor.
    public nonisolated let cache = TokenCache()
    /// Account events for `subscribe` connections.
    public nonisolated let events: EventHub
    /// Wall-clock time; expiry is always judged by it.
    public nonisolated let clock: any WallClock
    /// Who may use which account; replaced by a config reload.
    public nonisolated let accessRules = AccessRulesStore()
    /// Where accounts are offered to git and docker; replaced by a config reload.
    public nonisolated let bridges = BridgeSettingsStore()
    /// Whether the vault key is held (passphrase mode); see `unlock(with:)` and `lock()`.
    public nonisolated let padlock = Padlock()
    /// The engine's settings; replaced by a config reload.
    public nonisolated var settings: BrokerSettings { settingsBox.withLock { $0 } }
    private nonisolated let settingsBox: Mutex<BrokerSettings>
    /// The config file `reloadConfiguration()` reads, if any.
    private let configPath: String?
    let vault: Vault
    /// The pace of unlock attempts kept beside the vault, so that it outlives a restart.
    let unlockPace: UnlockPaceFile
    private let http: IdPClient
    let logger: Logger
    var planner: RefreshPlanner { RefreshPlanner(settings: settings) }
    /// Every account's lifecycle; the actor runs the effects its transitions return.
    var accounts: [String: AccountMachine] = [:] { didSet { changes.announce() } }
    /// Told of every change to `accounts`, so the scheduler and the service status sleep till then.
    public nonisolated let changes = ChangeBroadcast()
    /// The task of each refresh under way, by account, with the serial its machine knows it by.
    var refreshTasks: [String: (serial: Int, task: Task<Result<Void, BrokerFailure>, Never>)] = [:]
    /// Each account's provider, built when first needed (see `provider(for:)`).
    var tokenProviders: [String: any TokenProvider] = [:]
    /// Accounts changed in memory whose last save failed: the next save writes them too.
    var unsaved: Set<String> = []
    /// The configuration to apply at unlock: the one given while the broker was locked.
    var pendingConfiguration: BrokerConfiguration?
    private var refreshSerial = 0
    /// The narrowed refresh under way for each account and key (see `token(for:key:minTTL:)`).
    var narrowedRefreshes: [NarrowedRefresh: Task<Result<Void, BrokerFailure>, Never>] = [:]
    /// Until when a narrowed token whose refresh failed transiently is not asked for again, and why.
    var narrowedBackoffs: [NarrowedRefresh: (until: Date, reason: String)] = [:]
    /// The narrowed refreshes each caller may still start on each account.
    var narrowedBudget = NarrowedRefreshBudget()
    /// The refreshes waiting for their turn on each account's refresh-token chain; an account
    /// is here while one of its refreshes runs (see `takeChainTurn`).
    var chainQueues: [String: [CheckedContinuation<Void, Never>]] = [:]
    /// Accounts a login is running for.
    private var loginsRunning: Set<String> = []
    /// The token files kept fresh (`export_file`, `wlcg_account`), from the configuration.
    var tokenFiles = TokenFiles()

    /// Loads every account from `vault` (refusing a wrong key or tampered file) and schedules it;
    /// a vault that holds no key yet (passphrase mode) leaves the broker locked.
    public init(
        vault: Vault, settings: BrokerSettings, http: IdPClient, clock: any WallClock = SystemClock(),
        logger: Logger, configPath: String? = nil
    ) throws {
        self.vault = vault
        self.settingsBox = Mutex(settings)
        self.configPath = configPath
        self.http = http
        self.clock = clock
        self.logger = logger
        self.events = EventHub(bufferLimit: Bounds.count(settings.eventBuffer, in: 1...ConfigFile.maximumEventBuffer))
        unlockPace = UnlockPaceFile(vaultPath: vault.path)
        Self.restoreUnlockPace(from: unlockPace, into: padlock, now: clock.now(), logger: logger)
        guard !vault.isLocked else {
            padlock.enter(.locked, newVault: try vault.sealing() == nil)
            return
        }
        accounts = Self.machines(for: try vault.load(), settings: settings, cache: cache, now: clock.now())
        Self.reportLoad(of: vault, logger: logger)
    }

    /// The machines of the accounts `contents` holds; their servable tokens go to `cache`.
    static func machines(for contents: VaultContents?, settings: BrokerSettings, cache: TokenCache, now: Date)
        -> [String: AccountMachine]
    {
        var machines: [String: AccountMachine] = [:]
        SecretArena.shared.storing {
            for stored in contents?.accounts ?? [] {
                let machine = AccountMachine(
                    record: stored.sanitized(), planner: RefreshPlanner(settings: settings), now: now)
                machines[machine.record.name] = machine
                if let token = machine.servableToken {
                    // Out of guarded memory, the token is not cached: a request for it refreshes.
                    cache.publish(
                        try? PreparedToken(account: machine.record.name, token: token), for: machine.record.name)
                }
            }
        }
        return machines
    }

    /// Logs what `vault.load()` settled: a save a crash interrupted, a format converted.
    static func reportLoad(of vault: Vault, logger: Logger) {
        if vault.recoveredInterruptedSave {
            logger.notice("completed a vault save that a crash interrupted; no rotated credential was lost")
        }
        if let version = vault.convertedFormatVersion {
            logger.notice("converted the vault from format \(version); brokerd versions before it cannot read it")
        }
    }

    // MARK: Client operations

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
        switch try await refreshForToken(name, minTTL: minTTL) {
        case .ready(let token):
            return token
        case .refreshing(let refresh, let source):
            let outcome = await refresh.value
            if let token = cache.token(for: name, minTTL: minTTL, now: clock.now()) { return token }
            if case .failure(let error) = outcome { throw error }
            throw .tokenTooShort(heldBy: source, minTTL: minTTL)
        }
    }

    /// What a `token` call for `name` that missed the cache gets on the actor.
    enum TokenWait {
        /// A refresh that ended since the call looked filled the cache.
        case ready(PreparedToken)
        /// The refresh to wait for (joined if one is under way), and what holds the tokens.
        case refreshing(Task<Result<Void, BrokerFailure>, Never>, BrokerFailure.TokenSource)
    }

    /// The token, or the refresh a `token` call for `name` waits for; refuses an account that
    /// cannot give a token for `minTTL`. Looks at the cache again first, on the actor, so a
    /// call that missed it just before a refresh ended does not start another.
    private func refreshForToken(_ name: String, minTTL: TimeInterval) throws(BrokerFailure) -> TokenWait {
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
    /// returns the newer token at once.
    public func reject(_ accessToken: SecretBytes, of account: AccountName, minTTL: TimeInterval)
        async throws(BrokerFailure) -> PreparedToken
    {
        let name = account.rawValue
        let machine = try self.machine(name)
        guard machine.record.token?.value == accessToken else {
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
        describe(try machine(account.rawValue), now: clock.now())
    }

    /// Where every account stands, sorted by name.
    public func snapshots() -> [AccountSnapshot] {
        let now = clock.now()
        return accounts.keys.sorted().compactMap { accounts[$0].map { describe($0, now: now) } }
    }

    /// A one-line summary such as "5 accounts: 4 valid, 1 needs login" (systemd `STATUS=`).
    public func summary() -> String {
        if padlock.isLocked { return "locked (run brokerctl unlock)" }
        let now = clock.now()
        var counts: [String: Int] = [:]
        for machine in accounts.values { counts[machine.state(now: now).rawValue, default: 0] += 1 }
        let noun = accounts.count == 1 ? "account" : "accounts"
        guard !counts.isEmpty else { return "0 accounts" }
        let parts = counts.sorted { $0.key < $1.key }.map {
            "\($0.value) \($0.key.replacing("_", with: " "))"
        }
        return "\(accounts.count) \(noun): " + parts.joined(separator: ", ")
    }

    // MARK: Owner operations

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
    private func create(
        _ account: AccountName, provider: ProviderConfig, clientSecret: SecretBytes?,
        filling fill: (inout AccountRecord, Date) -> Void
    ) throws(BrokerFailure) -> AccountSnapshot {
        let name = account.rawValue
        guard !padlock.isLocked else { throw .locked }
        guard accounts[name] == nil else { throw .accountExists(account) }
        let now = clock.now()
        var record = AccountRecord(
            name: name, provider: provider, secrets: AccountSecrets(clientSecret: clientSecret), token: nil,
            needsLogin: false, lastError: nil, lastRefreshAt: nil)
        fill(&record, now)
        var machine = AccountMachine(record: record, planner: planner, now: now)
        let effects = machine.tokensReplaced(by: record, planner: planner, now: now)
        accounts[name] = machine
        try run(effects, for: name)
        logger.info("account added", metadata: ["account": "\(name)", "provider": "\(provider.kind)"])
        let added = describe(try self.machine(name), now: clock.now())
        events.publish(AccountEvent(kind: .added, account: account, at: now, state: added.state))
        return added
    }

    /// Replaces an account's tokens; clears a denial, a logout and any backoff.
    public func setTokens(of account: AccountName, to tokens: TokenPush) throws(BrokerFailure) -> AccountSnapshot {
        _ = try machine(account.rawValue)
        guard !tokens.isEmpty else { throw .nothingToPush }
        return try replaceTokens(of: account) { record, now in apply(tokens, to: &record, now: now) }
    }

    /// Replaces an account's tokens with those `fill` puts into its record; clears a denial, a
    /// logout and any backoff.
    private func replaceTokens(of account: AccountName, filling fill: (inout AccountRecord, Date) -> Void)
        throws(BrokerFailure) -> AccountSnapshot
    {
        let name = account.rawValue
        var machine = try self.machine(name)
        try checkNotLoggingOut(machine)
        let now = clock.now()
        var record = machine.record
        fill(&record, now)
        let effects = machine.tokensReplaced(by: record, planner: planner, now: now)
        accounts[name] = machine
        try run(effects, for: name)
        cache.withdrawNarrowed(for: name)
        logger.info("tokens replaced", metadata: ["account": "\(name)"])
        return describe(try self.machine(name), now: clock.now())
    }

    /// Signs the user in at the IdP of `account` and stores the tokens it issues: creates the
    /// account with `provider` (and `clientSecret`) when it does not exist, otherwise restores it
    /// in place with its own settings, as `setTokens` would. Waits for the user off the actor;
    /// `progress` receives what to show them. A cancelled login stores nothing.
    public func login(
        _ account: AccountName, provider: ProviderConfig?, clientSecret: SecretBytes?, options: LoginOptions,
        progress: @escaping @Sendable (LoginProgress) async -> Void
    ) async throws(BrokerFailure) -> (snapshot: AccountSnapshot, hasIDToken: Bool) {
        let name = account.rawValue
        let (config, secret) = try loginSettings(account, provider: provider, clientSecret: clientSecret)
        guard let settings = config.settings as? OAuth2Settings else {
            throw .invalid("\(name) is a \(config.kind) account; only oauth2 accounts can log in")
        }
        guard loginsRunning.insert(name).inserted else { throw .loginRunning(account) }
        let restoring = accounts[name] != nil
        defer { loginsRunning.remove(name) }
        let context = LoginContext(
            account: account, settings: settings, clientSecret: secret, http: http, clock: clock,
            defaultLifetime: self.settings.defaultLifetime, progress: progress)
        /// Stores what the IdP granted (saved to the vault before it returns).
        func keep(_ grant: Grant) throws(BrokerFailure) -> (snapshot: AccountSnapshot, hasIDToken: Bool) {
            if Task.isCancelled { throw context.cancelled }
            // The account may have been added, removed or reconfigured while the user signed in; a
            // removed one stays removed.
            if restoring && accounts[name] == nil { throw .noSuchAccount(account) }
            _ = try loginSettings(account, provider: config, clientSecret: secret)
            let snapshot: AccountSnapshot
            if accounts[name] == nil {
                snapshot = try create(account, provider: config, clientSecret: secret) { record, _ in
                    apply(grant, to: &record)
                }
            } else {
                snapshot = try replaceTokens(of: account) { record, _ in apply(grant, to: &record) }
            }
            logger.info("logged in", metadata: ["account": "\(name)", "flow": "\(options.flow.rawValue)"])
            return (snapshot, grant.token.idToken != nil)
        }
        switch options.flow {
        case .device: return try keep(try await DeviceAuthorization.run(context, timeout: options.timeout))
        case .browser:
            // The browser's page answers after the tokens are saved, with how that went.
            return try await AuthorizationCodeLogin.run(
                context, redirectPort: options.redirectPort, timeout: options.timeout, keep: keep)
        }
    }

    /// The settings and client secret a login of `account` uses: an existing account's own
    /// (a provider or secret given must be the same), else the ones given.
    private func loginSettings(_ account: AccountName, provider: ProviderConfig?, clientSecret: SecretBytes?)
        throws(BrokerFailure) -> (ProviderConfig, SecretBytes?)
    {
        guard let machine = accounts[account.rawValue] else {
            guard let provider else { throw .loginNeedsProvider(account) }
            return (provider, clientSecret)
        }
        try checkNotLoggingOut(machine)
        let record = machine.record
        if let provider, provider != record.provider { throw .loginSettingsDiffer(account) }
        if let clientSecret, clientSecret != record.secrets.clientSecret { throw .loginSettingsDiffer(account) }
        return (record.provider, record.secrets.clientSecret)
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
    private func refreshForIDToken(_ account: AccountName) async throws(BrokerFailure) -> TimeInterval? {
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
    private func heldIDToken(_ account: AccountName) throws(BrokerFailure) -> SecretBytes {
        guard let idToken = try machine(account.rawValue).servableToken?.idToken else {
            throw .noIDToken(account)
        }
        return idToken
    }

    /// Deletes an account and its secrets.
    public func remove(_ account: AccountName) throws(BrokerFailure) {
        let name = account.rawValue
        try checkNotLoggingOut(try machine(name))
        guard let removed = accounts.removeValue(forKey: name) else { throw .noSuchAccount(account) }
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
    /// already under way): an owner operation, which only `admins` reach (README "Limits").
    public func refreshNow(_ account: AccountName) async throws(BrokerFailure) -> AccountSnapshot {
        let name = account.rawValue
        let machine = try self.machine(name)
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
        try checkNotLoggingOut(machine)
        // From here, nothing else may change or refresh the account: `set_tokens` and `remove`
        // are refused, and no refresh starts, so the record after each await is this one.
        guard machine.beginLogout() else { return .alreadyLoggedOut }
        accounts[name] = machine
        // A refresh under way may rotate the credential: revoke the one it leaves behind.
        _ = await refreshTasks[name]?.task.value
        await takeChainTurn(name)
        defer { endChainTurn(name) }
        let current = try self.machine(name).record

        var revoked = false
        let answer = await provider(for: current).revoke(current)
        switch answer.mapError(current.outsideText().clean) {
        case .success(let revocation):
            revoked = revocation == .revoked
        case .failure(let failure) where !force:
            accounts[name]?.logoutRefused()
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
        logger.info("logged out", metadata: ["account": "\(name)", "revoked": "\(revoked)"])
        return revoked ? .revoked : .discarded
    }

    // MARK: Configuration

    /// Re-reads the config file and applies it; a broken file changes nothing. Returns the
    /// number of accounts afterwards.
    @discardableResult
    public func reloadConfiguration() throws(BrokerFailure) -> Int {
        guard let configPath else { return accounts.count }
        let configuration: BrokerConfiguration
        do {
            configuration = try ConfigFile.load(path: configPath)
        } catch {
            logger.error("config not reloaded; the running configuration stays", metadata: ["reason": "\(error)"])
            throw .configUnreadable(reason: "\(error)")
        }
        try configure(configuration)
        return accounts.count
    }

    /// Applies settings and declared accounts. Declared accounts get their provider settings
    /// from the config and keep their secrets; an account no longer declared stays as a
    /// runtime account (nothing secret is ever deleted by editing a file).
    public func configure(_ configuration: BrokerConfiguration) throws(BrokerFailure) {
        guard !padlock.isLocked else {
            // Declared accounts are checked against the vault's, and saved to it, at unlock.
            settingsBox.withLock { $0 = configuration.settings }
            pendingConfiguration = configuration
            padlock.declare(configuration.accounts.map { Padlock.LockedAccount(name: $0.key, kind: $0.value.kind) })
            return
        }
        var providers: [String: ProviderConfig] = [:]
        /// Logged-out accounts the config moves elsewhere: their client secret stays behind.
        var moved: Set<String> = []
        for (name, spec) in configuration.accounts {
            do throws(BrokerFailure) {
                let account = try AccountName(name)
                let provider = try ProviderConfig.checking(spec).0
                if let stored = accounts[name]?.record, let move = stored.provider.credentialMove(to: provider) {
                    guard !stored.holdsCredential else { throw .credentialWouldMove(account, move: move) }
                    moved.insert(name)
                }
                providers[name] = provider
            } catch {
                logger.error("config not applied", metadata: ["account": "\(name)", "reason": "\(error)"])
                throw .configNotApplied(account: name, because: error)
            }
        }
        settingsBox.withLock { $0 = configuration.settings }
        accessRules.replace(with: configuration.access)
        for path in configuration.access.replaceablePrograms() {
            logger.warning(
                "a listed executable is writable by the broker's user, so a rule naming it stops none of its programs",
                metadata: ["path": "\(JSONText.quote(path))"])
        }
        bridges.replace(with: configuration.bridges)
        let now = clock.now()
        let stored = accounts.mapValues(\.record)
        for (name, provider) in providers {
            var machine =
                accounts[name]
                ?? AccountMachine(
                    record: AccountRecord(
                        name: name, provider: provider, secrets: AccountSecrets(), token: nil, needsLogin: false,
                        lastError: nil, lastRefreshAt: nil),
                    planner: planner, now: now)
            // A logged-out account may move, but the client secret was issued for the old place.
            let dropClientSecret = moved.contains(name) && machine.record.secrets.clientSecret != nil
            if dropClientSecret {
                logger.notice(
                    "account moved to another IdP; its client secret was discarded (add the account again to set one)",
                    metadata: ["account": "\(name)"])
            }
            machine.declared(provider: provider, dropClientSecret: dropClientSecret, planner: planner, now: now)
            accounts[name] = machine
        }
        for (name, machine) in accounts where machine.record.declared == true && providers[name] == nil {
            accounts[name]?.undeclared()
            logger.notice(
                "account no longer declared in the config; kept as a runtime account", metadata: ["account": "\(name)"])
        }
        // New settings, or a declared account's new provider settings: every provider is built
        // afresh (a refresh under way finishes with the provider it started with).
        tokenProviders = [:]
        for name in accounts.keys { accounts[name]?.restartPolling() }
        let wlcgFile = configuration.wlcgAccount == nil ? nil : DefaultPaths().wlcgBearerTokenFile
        if configuration.wlcgAccount != nil, wlcgFile == nil {
            logger.warning("wlcg_account ignored: no XDG_RUNTIME_DIR (nor /run/user/UID) to hold bt_u$UID")
        }
        let filePaths = TokenFiles.paths(for: configuration, wlcgFile: wlcgFile)
        rewriteTokenFiles(of: tokenFiles.replace(with: filePaths, logger: logger))
        // Usually nothing stored changed (a start with the same file): no vault write then.
        let changed = accounts.filter { stored[$0.key] != $0.value.record }.keys
        if !changed.isEmpty { try persist(changing: changed) }
        logger.info("configuration applied", metadata: ["declared_accounts": "\(providers.count)"])
    }

    /// Writes the token files of `names` from their accounts' servable tokens (removes them
    /// for an account that has none).
    func rewriteTokenFiles(of names: some Sequence<String>) {
        for name in names { tokenFiles.update(name, token: accounts[name]?.servableToken, logger: logger) }
    }

    // MARK: Scheduling

    /// Starts every refresh that is due and returns when the next one will be. Refreshes found
    /// long overdue (the machine slept, or the wall clock jumped) are spread over the next
    /// `overdueSpread` seconds instead of all hitting the IdPs in the same instant; a client
    /// that needs such an account's token meanwhile gets an on-demand refresh.
    public func runDueRefreshes() -> Date? {
        let now = clock.now()
        let (threshold, spread) = (settings.overdueThreshold, settings.overdueSpread)
        var next: Date?
        for name in accounts.keys {
            if let poll = pollSource(name, now: now) { next = min(next ?? poll, poll) }
            switch accounts[name]?.due(now: now, overdueThreshold: threshold, spread: Double.random(in: 0...spread))
            {
            case .refreshNow: _ = startRefresh(name, forClient: false)
            case .at(let due): next = min(next ?? due, due)
            case .nothing, nil: break
            }
        }
        return next
    }

    /// Asks the provider of an account that watches its source whether the source changed, once
    /// every poll interval, and starts a refresh when it did. Returns when to ask next.
    private func pollSource(_ name: String, now: Date) -> Date? {
        guard let poll = accounts[name]?.poll(now: now) else { return nil }
        if poll.askNow, let machine = accounts[name], machine.refreshSerial == nil,
            provider(for: machine.record).sourceChanged()
        {
            _ = startRefresh(name, forClient: false)
        }
        return poll.next
    }

    /// Waits for refreshes under way, so their vault writes complete before exit.
    public func drain() async {
        for running in refreshTasks.values {
            _ = await running.task.value
        }
        for running in narrowedRefreshes.values {
            _ = await running.value
        }
    }

    // MARK: Refresh machinery

    /// Refreshes `name` (for a client's request when `forClient`), or joins the refresh under
    /// way (single flight).
    private func refreshShared(_ name: String, forClient: Bool) async -> Result<Void, BrokerFailure> {
        guard accounts[name] != nil else { return .failure(.noSuchAccount(AccountName(known: name))) }
        return await startRefresh(name, forClient: forClient).value
    }

    /// Starts a refresh of `name` and returns its task; joins the one under way, if any. One
    /// started `forClient` (a client's request, not the schedule, new tokens or the owner) holds
    /// off the next client's request for `minimumRefreshInterval` (`tokenInsteadOfRefresh`).
    private func startRefresh(_ name: String, forClient: Bool) -> Task<Result<Void, BrokerFailure>, Never> {
        guard !padlock.isLocked else { return Task { .failure(.locked) } }
        if let serial = accounts[name]?.refreshSerial, let running = refreshTasks[name], running.serial == serial {
            return running.task
        }
        refreshSerial += 1
        let serial = refreshSerial
        guard accounts[name]?.beginRefresh(serial: serial, forClient: forClient) == true else {
            let refusal = BrokerFailure.refreshNotStarted(AccountName(known: name))
            return Task { .failure(refusal) }
        }
        let task = Task { await self.performRefresh(name, serial: serial) }
        refreshTasks[name] = (serial, task)
        return task
    }

    private func performRefresh(_ name: String, serial: Int) async -> Result<Void, BrokerFailure> {
        defer { if refreshTasks[name]?.serial == serial { refreshTasks[name] = nil } }
        await takeChainTurn(name)
        defer { endChainTurn(name) }
        guard let started = accounts[name]?.record else { return .failure(.noSuchAccount(AccountName(known: name))) }
        // New tokens or a removal came while it waited for its turn: nothing to present.
        guard accounts[name]?.refreshSerial == serial else {
            return .failure(.changedDuringRefresh(AccountName(known: name)))
        }
        let provider = provider(for: started)
        let asked = ContinuousClock.now
        // Whatever the IdP or helper wrote is cleaned here, once, before it is stored, logged or sent.
        let outcome = await provider.refresh(started, now: clock.now()).mapError(started.outsideText().clean)
        let answered = ContinuousClock.now
        let now = clock.now()
        guard accounts[name] != nil else { return .failure(.changedDuringRefresh(AccountName(known: name))) }
        let result: AccountMachine.RefreshResult
        var delay: TimeInterval = 0
        var probeDelay: TimeInterval = 0
        switch outcome {
        case .success(let grant):
            result = accounts[name]!.refreshSucceeded(
                serial: serial, presented: started.secrets, grant: grant, planner: planner, now: now)
        case .failure(let failure) where failure.kind == .denial:
            result = accounts[name]!.refreshDenied(serial: serial, message: failure.message, now: now)
        case .failure(let failure):
            delay = planner.backoff(failures: accounts[name]!.failures + 1, retryAfter: failure.retryAfter)
            probeDelay = planner.probeDelay(backoff: delay, retryAfter: failure.retryAfter)
            result = accounts[name]!.refreshFailed(
                serial: serial, message: failure.message, delay: delay, probeDelay: probeDelay, now: now)
        }
        switch (result, outcome) {
        case (.overtaken(let effects), _):
            try? run(effects, for: name)
            return .failure(.changedDuringRefresh(AccountName(known: name)))
        case (.applied([]), .success):
            return .success(())
        case (.applied(let effects), .success(let grant)):
            do {
                try run(effects, for: name)
            } catch {
                accounts[name]?.saveFailed(planner: planner, now: now)
                return .failure(error)
            }
            // How long the IdP took, and how long a rotated credential then existed only in
            // memory (the IdP's answer to the fsync).
            logger.info(
                "refreshed",
                metadata: [
                    "account": "\(name)", "expires_in": "\(Bounds.wholeSeconds(grant.token.remaining(at: now)))",
                    "idp_us": "\(Self.microseconds(asked.duration(to: answered)))",
                    "saved_after_us": "\(Self.microseconds(answered.duration(to: .now)))",
                ])
            return .success(())
        case (.applied(let effects), .failure(let failure)) where failure.kind == .denial:
            try? run(effects, for: name)
            logger.warning(
                "refresh denied; needs login", metadata: ["account": "\(name)", "reason": "\(failure.message)"])
            return .failure(Self.denial(of: started, reason: failure.message))
        case (.applied(let effects), .failure(let failure)):
            try? run(effects, for: name)
            logger.warning(
                "refresh failed; will retry",
                metadata: [
                    "account": "\(name)", "reason": "\(failure.message)",
                    "retry_in_s": "\(Bounds.wholeSeconds(delay.rounded(.up)))",
                ])
            return .failure(.refreshFailing(reason: failure.message, retryAfter: probeDelay))
        }
    }

    /// Obtains an account's tokens; built once per account from its settings and the engine's
    /// (again after a reload), so a provider that watches a source keeps what it saw.
    func provider(for record: AccountRecord) -> any TokenProvider {
        if let provider = tokenProviders[record.name] { return provider }
        let provider = record.provider.makeProvider(ProviderContext(http: http, settings: settings, logger: logger))
        tokenProviders[record.name] = provider
        return provider
    }

    func machine(_ name: String) throws(BrokerFailure) -> AccountMachine {
        guard !padlock.isLocked else { throw .locked }
        guard let machine = accounts[name] else { throw .noSuchAccount(AccountName(known: name)) }
        return machine
    }

    /// Fails fast for accounts that cannot be refreshed now, instead of calling the IdP.
    func checkRefreshable(_ machine: AccountMachine) throws(BrokerFailure) {
        try checkCredentialUsable(machine)
        guard machine.refreshesOnItsOwn else {
            throw .noTokenLongEnough(AccountName(known: machine.record.name), kind: machine.record.provider.kind)
        }
        if let wait = machine.probeWait(now: clock.now()) {
            throw .refreshFailing(
                reason: machine.record.lastError?.message ?? "the IdP is failing; retrying", retryAfter: wait)
        }
    }

    /// What a client's request that would refresh `machine` gets instead within
    /// `minimumRefreshInterval` of the last refresh a client's request started (README
    /// "Limits"): the token held while it has not expired, else `refreshTooSoon`. `nil`: the
    /// refresh may start (or join the one under way).
    private func tokenInsteadOfRefresh(_ machine: AccountMachine) throws(BrokerFailure) -> PreparedToken? {
        let now = clock.now()
        guard let wait = machine.clientRefreshWait(interval: settings.minimumRefreshInterval, now: now) else {
            return nil
        }
        if let held = cache.token(for: machine.record.name, minTTL: 0, now: now), held.expiresAt > now { return held }
        throw .refreshTooSoon(AccountName(known: machine.record.name), retryAfter: wait)
    }

    /// Refuses accounts whose credential was denied, discarded, or is being revoked.
    private func checkCredentialUsable(_ machine: AccountMachine) throws(BrokerFailure) {
        let name = AccountName(known: machine.record.name)
        let signsIn = machine.record.provider.signsIn
        switch machine.refusal {
        case .loggedOut: throw .loggedOut(name, signsIn: signsIn)
        case .denied: throw Self.denial(of: machine.record, reason: machine.record.lastError?.message)
        case .loggingOut: throw .loggingOut(name)
        case nil: break
        }
    }

    /// Why an account held as denied serves no token: a credential it never held (no IdP was
    /// asked), a client the IdP does not accept, or a credential the IdP refused. `reason` is
    /// the denial's message.
    static func denial(of record: AccountRecord, reason: String?) -> BrokerFailure {
        let name = AccountName(known: record.name)
        if let credential = record.provider.missingCredential(in: record.secrets) {
            return .noCredential(name, credential: credential, signsIn: record.provider.signsIn)
        }
        if let reason, OAuth2Provider.rejectsClient(reason) { return .clientRejected(name, reason: reason) }
        return .denied(name, signsIn: record.provider.signsIn)
    }

    private func checkNotLoggingOut(_ machine: AccountMachine) throws(BrokerFailure) {
        if machine.isLoggingOut { throw .loggingOut(AccountName(known: machine.record.name)) }
    }

    /// Refuses, without calling the IdP, a `minTTL` longer than the lifetime the IdP grants,
    /// while the current token is not yet due for refresh (a refresh could not help).
    func checkLifetime(_ machine: AccountMachine, covers minTTL: TimeInterval) throws(BrokerFailure) {
        guard machine.record.provider.renewal == .refreshes, let token = machine.record.token, token.pushed != true,
            token.expiresAt > clock.now(),
            let due = machine.nextRefreshAt, due > clock.now(),
            token.expiresAt.timeIntervalSince(token.obtainedAt) < minTTL
        else { return }
        throw .lifetimeTooShort(lifetime: token.expiresAt.timeIntervalSince(token.obtainedAt), minTTL: minTTL)
    }

    /// Puts pushed tokens into `record`: an access token without an expiry lives the default
    /// lifetime; a refresh token replaces the old one and its expiry.
    private func apply(_ tokens: TokenPush, to record: inout AccountRecord, now: Date) {
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
    }

    /// Puts the tokens a login obtained into `record`: they replace every token and refresh
    /// credential it held (a login without an id token leaves none).
    private func apply(_ grant: Grant, to record: inout AccountRecord) {
        record.token = grant.token
        record.grantedScope = grant.token.scope
        record.secrets.refreshToken = grant.refreshToken
        record.secrets.refreshExpiresAt = grant.refreshExpiresAt
        record.secrets.refreshURL = nil
    }

    /// Runs a transition's effects in order; a failed save stops the rest and is thrown.
    func run(_ effects: [AccountMachine.Effect], for name: String) throws(BrokerFailure) {
        for effect in effects {
            switch effect {
            case .persist:
                try persist(changing: [name])
            case .publish(let token):
                // A broker that is locking (a refresh that ends while `lock` waits for it) keeps
                // no token: it serves none and writes none.
                let token = padlock.isLocked ? nil : token
                // The files first, so that no token is served before they hold it.
                tokenFiles.update(name, token: token, logger: logger)
                do {
                    cache.publish(
                        try token.map { token throws(BrokerFailure) in try PreparedToken(account: name, token: token) },
                        for: name)
                } catch {
                    // Not the token it replaces either: that one is superseded.
                    cache.publish(nil, for: name)
                    throw error
                }
            case .emit(let kind, let message):
                guard let machine = accounts[name] else { continue }
                let now = clock.now()
                events.publish(
                    AccountEvent(
                        kind: kind, account: AccountName(known: name), at: now, state: machine.state(now: now),
                        message: message,
                        expiresAt: [.refreshed, .valid].contains(kind) ? machine.record.token?.expiresAt : nil))
            case .refresh:
                _ = startRefresh(name, forClient: false)
            }
        }
    }

    /// Saves the accounts `names` as they are now (a name no longer here is removed), with any
    /// whose earlier save failed.
    func persist(changing names: some Collection<String>) throws(BrokerFailure) {
        unsaved.formUnion(names)
        let changed = unsaved.sorted().compactMap { accounts[$0]?.record }
        let removed = unsaved.sorted().filter { accounts[$0] == nil }
        do {
            try vault.save(changed: changed, removed: removed)
            unsaved = []
        } catch {
            let accounts = names.count == 1 ? "\(names.first!)" : "\(names.count) accounts"
            logger.error("cannot save the vault", metadata: ["account": "\(accounts)", "reason": "\(error)"])
            throw .vaultNotSaved
        }
    }

    private static func microseconds(_ duration: Duration) -> Int64 {
        duration.components.seconds * 1_000_000 + duration.components.attoseconds / 1_000_000_000_000
    }

    private func describe(_ machine: AccountMachine, now: Date) -> AccountSnapshot {
        AccountSnapshot(
            name: AccountName(known: machine.record.name), kind: machine.record.provider.kind,
            state: machine.state(now: now), expiresAt: machine.record.token?.expiresAt,
            refreshExpiresAt: machine.record.secrets.refreshExpiresAt, nextRefreshAt: machine.nextRefreshAt,
            lastRefreshAt: machine.record.lastRefreshAt, lastError: machine.record.lastError,
            lostScope: machine.record.lostScope)
    }
}
