import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
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
    package nonisolated let settingsBox: Mutex<BrokerSettings>
    /// The config file `reloadConfiguration()` reads, if any.
    package let configPath: String?
    package let vault: Vault
    /// The pace of unlock attempts kept beside the vault, so that it outlives a restart.
    package let unlockPace: UnlockPaceFile
    package let http: IdPClient
    package let logger: Logger
    package var planner: RefreshPlanner { RefreshPlanner(settings: settings) }
    /// Every account's lifecycle; the actor runs the effects its transitions return. Each
    /// change to it is announced to `changes`.
    package var accounts: AccountTable
    /// Told of every change to `accounts`, so the scheduler and the service status sleep till then.
    public nonisolated let changes: ChangeBroadcast
    /// The task of each refresh under way, by account, with the serial its machine knows it by.
    package var refreshTasks: [String: (serial: Int, task: Task<Result<Void, BrokerFailure>, Never>)] = [:]
    /// Each account's provider, built when first needed (see `provider(for:)`).
    package var tokenProviders: [String: any TokenProvider] = [:]
    /// Accounts changed in memory whose last save failed: the next save writes them too.
    package var unsaved: Set<String> = []
    /// Why the last save failed, when, how many failed in a row, and when it is tried again
    /// (`retryFailedSave`); `nil` once a save succeeds. Meanwhile no local refresh starts.
    package var saveTrouble: (reason: String, at: Date, attempts: Int, retryAt: Date)?
    /// The configuration to apply at unlock: the one given while the broker was locked.
    package var pendingConfiguration: BrokerConfiguration?
    /// The serial the last refresh started was given (see `AccountMachine`).
    package var refreshSerial = 0
    /// The narrowed refresh under way for each account and key (see `token(for:key:minTTL:)`).
    package var narrowedRefreshes: [NarrowedRefresh: Task<Result<Void, BrokerFailure>, Never>] = [:]
    /// Until when a narrowed token whose refresh failed transiently is not asked for again, and why.
    package var narrowedBackoffs: [NarrowedRefresh: (until: Date, reason: String)] = [:]
    /// The narrowed refreshes each caller may still start on each account.
    package var narrowedBudget = NarrowedRefreshBudget()
    /// The refreshes waiting for their turn on each account's refresh-token chain; an account
    /// is here while one of its refreshes runs (see `takeChainTurn`).
    package var chainQueues: [String: [CheckedContinuation<Void, Never>]] = [:]
    /// The login running for each account, which other logins of the account join.
    package var logins: [String: RunningLogin] = [:]
    /// The number the last `login` was given (see `RunningLogin`).
    package var loginParticipants = 0
    /// The token files kept fresh (`export_file`, `wlcg_account`), from the configuration.
    package var tokenFiles = TokenFiles()
    /// The fleet's shared store and the shared accounts served from it (`joinFleet`); `nil`:
    /// every account is local.
    package var fleet: FleetMembership?
    /// Records of shared accounts the vault keeps for the fleet (an unshare or a commit a crash
    /// interrupted, `FleetMark`): not served as local accounts; `settleFleetMarks` settles them.
    package var heldForFleet: [String: AccountRecord] = [:]
    /// The vault's records this release cannot read, by name, with when they were loaded
    /// (`Broker+DamagedRecords`): shown, refused, removable, never served.
    package var damaged: [String: (record: DamagedRecord, since: Date)] = [:]

    /// Loads every account from `vault` (refusing a wrong key or tampered file) and schedules it;
    /// a vault that holds no key yet (passphrase mode) leaves the broker locked.
    public init(
        vault: Vault, settings: BrokerSettings, http: IdPClient, clock: any WallClock = SystemClock(),
        logger: Logger, configPath: String? = nil
    ) throws {
        self.vault = vault
        let changes = ChangeBroadcast()
        self.changes = changes
        accounts = AccountTable(changes: changes)
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
        let contents = try vault.load()
        accounts.replaceAll(
            with: Self.machines(for: contents, settings: settings, cache: cache, http: http, now: clock.now()))
        heldForFleet = Self.heldForFleet(in: contents)
        damaged = Self.damaged(in: contents, now: clock.now(), logger: logger)
        Self.reportLoad(of: vault, logger: logger)
    }

    /// The machines of the accounts `contents` holds; their servable tokens go to `cache`.
    package static func machines(
        for contents: VaultContents?, settings: BrokerSettings, cache: TokenCache, http: IdPClient, now: Date
    ) -> [String: AccountMachine] {
        var machines: [String: AccountMachine] = [:]
        SecretArena.shared.storing {
            for stored in contents?.accounts ?? [] where !isHeldForFleet(stored) {
                let machine = AccountMachine(
                    record: stored.sanitized(), planner: RefreshPlanner(settings: settings), now: now)
                machines[machine.record.name] = machine
                readDiscovery(for: machine.record, http: http)
                if let token = machine.servableToken {
                    // Out of guarded memory, the token is not cached: a request for it refreshes.
                    cache.publish(
                        try? PreparedToken(
                            account: machine.record.name, token: token,
                            dpop: machine.record.dpopSigning(http.discovery)),
                        for: machine.record.name)
                }
            }
        }
        return machines
    }

    /// Reads the discovery document of a DPoP account's issuer as the account loads, not at its
    /// first refresh: until it is read, proofs for programs are refused on the issuer's origin
    /// only, not yet at the endpoints it names elsewhere (`DPoPIdPEndpoints`).
    package static func readDiscovery(for record: AccountRecord, http: IdPClient) {
        guard record.dpopKey != nil, let issuer = (record.provider.settings as? OAuth2Settings)?.issuer,
            http.discovery.known(issuer: issuer) == nil
        else { return }
        Task { _ = await http.discovery.endpoints(issuer: issuer, http: http) }
    }

    /// Whether `record` is a shared account's that the vault keeps for the fleet rather than a
    /// local account (see `heldForFleet`).
    package static func isHeldForFleet(_ record: AccountRecord) -> Bool {
        [.unsharing, .uncommitted].contains(record.fleet?.step)
    }

    /// The records of `contents` held for the fleet, by name.
    package static func heldForFleet(in contents: VaultContents?) -> [String: AccountRecord] {
        Dictionary((contents?.accounts ?? []).filter(isHeldForFleet).map { ($0.name, $0) }) { $1 }
    }

    /// Logs what `vault.load()` settled: a save a crash interrupted, a format converted.
    package static func reportLoad(of vault: Vault, logger: Logger) {
        if vault.recoveredInterruptedSave {
            logger.notice("completed a vault save that a crash interrupted; no rotated credential was lost")
        }
        if let version = vault.convertedFormatVersion {
            logger.notice("converted the vault from format \(version); brokerd versions before it cannot read it")
        }
    }

    /// Obtains an account's tokens; built once per account from its settings and the engine's
    /// (again after a reload), so a provider that watches a source keeps what it saw.
    package func provider(for record: AccountRecord) -> any TokenProvider {
        if let provider = tokenProviders[record.name] { return provider }
        let provider = record.provider.makeProvider(ProviderContext(http: http, settings: settings, logger: logger))
        tokenProviders[record.name] = provider
        return provider
    }

    package func machine(_ name: String) throws(BrokerFailure) -> AccountMachine {
        guard !padlock.isLocked else { throw .locked }
        guard let machine = accounts[name] else {
            try checkNotDamaged(name)
            throw .noSuchAccount(AccountName(known: name))
        }
        return machine
    }

    /// Runs a transition's effects in order; a failed save stops the rest and is thrown.
    package func run(_ effects: [AccountMachine.Effect], for name: String) throws(BrokerFailure) {
        for effect in effects {
            switch effect {
            case .persist:
                // A shared account's state is its row, never the local vault (`vaultCopy`).
                try persist(changing: isShared(name) ? [] : [name])
            case .publish(let token):
                // A broker that is locking (a refresh that ends while `lock` waits for it) keeps
                // no token: it serves none and writes none.
                let token = padlock.isLocked ? nil : token
                // The files first, so that no token is served before they hold it.
                tokenFiles.update(name, token: token, logger: logger)
                do {
                    cache.publish(
                        try token.map { token throws(BrokerFailure) in
                            try PreparedToken(
                                account: name, token: token,
                                dpop: accounts[name]?.record.dpopSigning(http.discovery))
                        },
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

    /// Saves what the vault keeps for `names` as it is now (`vaultCopy`; nothing: removed),
    /// with any whose earlier save failed; those then serve what the failed save held back. A
    /// failure is kept in `saveTrouble`, and the save tried again after a backoff. Every write
    /// of the vault's records goes through here, the fleet's marks too.
    package func persist(changing names: some Collection<String>) throws(BrokerFailure) {
        unsaved.formUnion(names)
        guard !unsaved.isEmpty else {
            saveTrouble = nil
            return
        }
        let saving = unsaved.sorted()
        let copies = saving.map { (name: $0, record: vaultCopy(of: $0)) }
        do {
            try vault.save(
                changed: copies.compactMap(\.record), removed: copies.filter { $0.record == nil }.map(\.name))
        } catch {
            let now = clock.now()
            let attempts = (saveTrouble?.attempts ?? 0) + 1
            let retryAt = now.addingTimeInterval(planner.backoff(failures: attempts, retryAfter: nil))
            saveTrouble = ("cannot save the vault: \(error)", now, attempts, retryAt)
            let accounts = saving.count == 1 ? "\(saving[0])" : "\(saving.count) accounts"
            logger.error("cannot save the vault", metadata: ["account": "\(accounts)", "reason": "\(error)"])
            throw .vaultNotSaved
        }
        unsaved = []
        saveTrouble = nil
        for name in saving {
            if let effects = accounts[name]?.saved() { try? run(effects, for: name) }
        }
    }

    /// What the vault keeps for `name`: for a shared account only a mark of the fleet's
    /// (`FleetAccountMachine.vaultCopy`), else a record held for the fleet or the account's own.
    package func vaultCopy(of name: String) -> AccountRecord? {
        if let shared = fleet?.shared[name] { return shared.vaultCopy }
        return heldForFleet[name] ?? accounts[name]?.record
    }

    package func describe(_ machine: AccountMachine, now: Date) -> AccountSnapshot {
        let state = machine.state(now: now)
        let restoration: Restoration?
        switch state {
        case .needsLogin, .loggedOut: restoration = self.restoration(of: machine.record)
        case .stale, .unavailable: restoration = .retry
        case .valid, .refreshing, .degraded, .damaged: restoration = nil
        }
        return AccountSnapshot(
            name: AccountName(known: machine.record.name), kind: machine.record.provider.kind,
            state: state, expiresAt: machine.record.token?.expiresAt,
            refreshExpiresAt: machine.record.secrets.refreshExpiresAt, nextRefreshAt: machine.nextRefreshAt,
            lastRefreshAt: machine.record.lastRefreshAt,
            lastError: unsavedError(of: machine) ?? machine.record.lastError,
            lostScope: machine.record.lostScope, shared: sharedStatus(of: machine.record.name),
            dpop: machine.record.dpopStatus, restoration: restoration
        )
        .degraded(fleet?.shared[machine.record.name]?.pending != nil || unsaved.contains(machine.record.name))
    }

    /// Why the account's last change is not in the vault, while it is not (`unsaved`).
    private func unsavedError(of machine: AccountMachine) -> AccountError? {
        guard unsaved.contains(machine.record.name), let trouble = saveTrouble else { return nil }
        return AccountError(code: "unavailable", message: trouble.reason, at: trouble.at)
    }
}
