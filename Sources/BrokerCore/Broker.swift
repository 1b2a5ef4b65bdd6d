import BrokerProtocol
import FoundationEssentials
import Logging
import Synchronization

/// The broker engine: owns every account, decides and runs refreshes (one at a time per
/// account), keeps the vault in step, and publishes servable tokens to `cache`.
public actor Broker {
    /// One account and what the engine tracks about it beyond the vault record.
    private struct Entry {
        var record: AccountRecord
        var nextRefreshAt: Date?
        /// Transient failures since the last success.
        var failures = 0
        /// Until then, `token` fails fast instead of calling a failing IdP again.
        var retryAt: Date?
        /// The one refresh under way (single flight) and its serial number.
        var inFlight: (serial: Int, task: Task<Result<Void, BrokerError>, Never>)?
        /// Bumped when tokens are replaced, so a refresh started before that is discarded.
        var generation = 0
        /// Set when an overdue refresh was pushed back to spread a backlog; it runs when next due.
        var spreadOverdue = false
        /// Set while `logout` revokes the credential: no refresh may rotate it meanwhile.
        var loggingOut = false

        /// Starts the account's lifecycle over (new tokens, or none after a logout): no denial,
        /// no error, no backoff, and any refresh under way is abandoned.
        mutating func restart(loggedOut: Bool) {
            record.needsLogin = false
            record.loggedOut = loggedOut ? true : nil
            record.lastError = nil
            failures = 0
            retryAt = nil
            generation += 1
            inFlight = nil
        }
    }

    /// Tokens ready to serve, readable without entering the actor.
    public nonisolated let cache = TokenCache()
    /// Account events for `subscribe` connections.
    public nonisolated let events: EventHub
    /// Wall-clock time; expiry is always judged by it.
    public nonisolated let clock: any WallClock
    /// The engine's settings; replaced by a config reload.
    public nonisolated var settings: BrokerSettings { settingsBox.withLock { $0 } }
    private nonisolated let settingsBox: Mutex<BrokerSettings>
    /// The config file `reloadConfiguration()` reads, if any.
    private let configPath: String?
    private let vault: Vault
    private let http: IdPClient
    private let logger: Logger
    private var planner: RefreshPlanner { RefreshPlanner(settings: settings) }
    private var entries: [String: Entry] = [:]
    private var refreshSerial = 0

    /// Loads every account from `vault` (refusing a wrong key or tampered file) and schedules it.
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
        let now = clock.now()
        let contents = try vault.load()
        if vault.recoveredInterruptedSave {
            logger.notice("completed a vault save that a crash interrupted; no rotated credential was lost")
        }
        for stored in contents?.accounts ?? [] {
            let record = stored.sanitized()
            entries[record.name] = Entry(
                record: record, nextRefreshAt: Self.schedule(record, RefreshPlanner(settings: settings), now: now))
            if !record.needsLogin, record.loggedOut != true, let token = record.token {
                cache.publish(Self.prepare(record.name, token), for: record.name)
            }
        }
    }

    // MARK: Client operations

    /// A token valid for `minTTL` seconds, refreshing (once, shared) when the cached one falls short.
    public func token(account name: String, minTTL: TimeInterval) async throws(BrokerError) -> PreparedToken {
        if let token = cache.token(for: name, minTTL: minTTL, now: clock.now()) { return token }
        let entry = try self.entry(name)
        try checkRefreshable(entry)
        try checkLifetime(entry, covers: minTTL)
        let outcome = await refreshShared(name)
        if let token = cache.token(for: name, minTTL: minTTL, now: clock.now()) { return token }
        if case .failure(let error) = outcome { throw error }
        throw BrokerError(
            .unavailable, "the IdP issued a token valid for less than min_ttl (\(Bounds.wholeSeconds(minTTL)) s)")
    }

    /// Handles a token a resource server refused: refreshes once if it is still current,
    /// otherwise returns the newer token at once.
    public func reject(account name: String, accessToken: String, minTTL: TimeInterval) async throws(BrokerError)
        -> PreparedToken
    {
        let entry = try self.entry(name)
        guard entry.record.token?.value == accessToken else {
            return try await token(account: name, minTTL: minTTL)
        }
        try checkRefreshable(entry)
        let outcome = await refreshShared(name)
        if case .failure(let error) = outcome { throw error }
        return try await token(account: name, minTTL: minTTL)
    }

    /// Status of one account, or of all of them sorted by name.
    public func status(account name: String?) throws(BrokerError) -> [AccountStatus] {
        let now = clock.now()
        if let name { return [describe(try entry(name), now: now)] }
        return entries.keys.sorted().map { describe(entries[$0]!, now: now) }
    }

    /// A one-line summary such as "5 accounts: 4 valid, 1 needs login" (systemd `STATUS=`).
    public func summary() -> String {
        let now = clock.now()
        var counts: [String: Int] = [:]
        for entry in entries.values { counts[state(of: entry, now: now), default: 0] += 1 }
        let noun = entries.count == 1 ? "account" : "accounts"
        guard !counts.isEmpty else { return "0 accounts" }
        let parts = counts.sorted { $0.key < $1.key }.map {
            "\($0.value) \($0.key.replacing("_", with: " "))"
        }
        return "\(entries.count) \(noun): " + parts.joined(separator: ", ")
    }

    // MARK: Owner operations

    /// Creates an account; an `oauth2` account given only a refresh token refreshes at once.
    public func add(account: String?, provider spec: ProviderSpec?, tokens: TokenSet?) throws(BrokerError)
        -> AccountResult
    {
        let name = try AccountSpec.validateName(account)
        guard entries[name] == nil else {
            throw BrokerError(.badRequest, "an account named \(name) exists; remove it first or use set_tokens")
        }
        let (provider, clientSecret) = try AccountSpec.provider(spec)
        let now = clock.now()
        var record = AccountRecord(
            name: name, provider: provider, secrets: AccountSecrets(clientSecret: clientSecret), token: nil,
            needsLogin: false, lastError: nil, lastRefreshAt: nil)
        if let tokens { try apply(tokens, to: &record, now: now) }
        entries[name] = Entry(record: record, nextRefreshAt: Self.schedule(record, planner, now: now))
        try persist(changing: name)
        logger.info("account added", metadata: ["account": "\(name)", "provider": "\(provider.kind)"])
        publishAndKick(name)
        let state = state(of: entries[name]!, now: clock.now())
        events.publish(BrokerEvent(event: .added, account: name, at: now, state: state))
        return AccountResult(account: name, state: state)
    }

    /// Replaces an account's tokens; clears `needs_login` and any backoff.
    public func setTokens(account: String?, tokens: TokenSet?) throws(BrokerError) -> AccountResult {
        let name = try AccountSpec.validateName(account)
        var entry = try self.entry(name)
        guard let tokens, tokens.accessToken != nil || tokens.refreshToken != nil || tokens.refreshURL != nil else {
            throw BrokerError(.badRequest, "\"tokens\" needs an access_token, a refresh_token or a refresh_url")
        }
        try checkNotLoggingOut(entry)
        let now = clock.now()
        try apply(tokens, to: &entry.record, now: now)
        entry.restart(loggedOut: false)
        entry.nextRefreshAt = Self.schedule(entry.record, planner, now: now)
        entries[name] = entry
        try persist(changing: name)
        logger.info("tokens replaced", metadata: ["account": "\(name)"])
        publishAndKick(name)
        return AccountResult(account: name, state: state(of: entries[name]!, now: clock.now()))
    }

    /// Deletes an account and its secrets.
    public func remove(account: String?) throws(BrokerError) -> AccountResult {
        let name = try AccountSpec.validateName(account)
        try checkNotLoggingOut(try entry(name))
        guard let removed = entries.removeValue(forKey: name) else { throw notFound(name) }
        do {
            try persist(changing: name)
        } catch {
            entries[name] = removed
            throw error
        }
        cache.publish(nil, for: name)
        logger.info("account removed", metadata: ["account": "\(name)"])
        events.publish(BrokerEvent(event: .removed, account: name, at: clock.now()))
        return AccountResult(account: name, state: "removed")
    }

    /// Refreshes now, ignoring the schedule (joins a refresh already under way).
    public func refreshNow(account: String?) async throws(BrokerError) -> AccountResult {
        let name = try AccountSpec.validateName(account)
        var entry = try self.entry(name)
        if case .static = entry.record.provider {
            throw BrokerError(.badRequest, "\(name) is a static account; push new tokens with set_tokens")
        }
        try checkCredentialUsable(entry)
        entry.retryAt = nil
        entries[name] = entry
        if case .failure(let error) = await refreshShared(name) { throw error }
        return AccountResult(account: name, state: state(of: try self.entry(name), now: clock.now()))
    }

    /// Logs an account out: revokes its credential at the IdP where the provider can, then
    /// discards every token and refresh credential; the account keeps its settings (and client
    /// secret) in state `logged_out` until new tokens are pushed. Refused while the IdP cannot
    /// be reached, unless `force`, so a credential is never left alive at the IdP by accident.
    public func logout(account: String?, force: Bool) async throws(BrokerError) -> LogoutResult {
        let name = try AccountSpec.validateName(account)
        let entry = try self.entry(name)
        if entry.record.loggedOut == true { return LogoutResult(account: name, state: "logged_out", revoked: false) }
        try checkNotLoggingOut(entry)
        // While set, nothing else may change or refresh the account: `set_tokens` and `remove`
        // are refused, and no refresh starts, so the entry after each await is this one.
        entries[name]?.loggingOut = true
        defer { entries[name]?.loggingOut = false }
        // A refresh under way may rotate the credential: revoke the one it leaves behind.
        _ = await entry.inFlight?.task.value
        guard let current = entries[name] else { throw notFound(name) }
        let due = current.nextRefreshAt
        entries[name]?.nextRefreshAt = nil

        var revoked = false
        let answer = await makeProvider(current.record.provider).revoke(current.record)
        switch answer.mapError(current.record.outsideText().clean) {
        case .success(let revocation):
            revoked = revocation == .revoked
        case .failure(let failure) where !force:
            entries[name]?.nextRefreshAt = due
            logger.warning(
                "logout refused: cannot revoke", metadata: ["account": "\(name)", "reason": "\(failure.message)"])
            let wait =
                failure.kind == .transient ? min(failure.retryAfter ?? settings.backoffBase, settings.backoffCap) : nil
            throw BrokerError(
                .unavailable,
                "cannot revoke \(name) at the IdP (\(failure.message)); nothing was discarded. "
                    + (wait == nil ? "Check the account's settings, " : "Try again later, ")
                    + "or brokerctl logout \(name) --force to discard it without revoking",
                retryAfterMs: wait.map(Bounds.milliseconds))
        case .failure(let failure):
            logger.warning(
                "forced logout without revocation", metadata: ["account": "\(name)", "reason": "\(failure.message)"])
        }

        // Discarded in memory even if the vault cannot be saved: a revoked token must not be served.
        entries[name]?.record.secrets = AccountSecrets(clientSecret: current.record.secrets.clientSecret)
        entries[name]?.record.token = nil
        entries[name]?.restart(loggedOut: true)
        entries[name]?.nextRefreshAt = nil
        cache.publish(nil, for: name)
        try persist(changing: name)
        let now = clock.now()
        events.publish(BrokerEvent(event: .loggedOut, account: name, at: now, state: "logged_out"))
        logger.info("logged out", metadata: ["account": "\(name)", "revoked": "\(revoked)"])
        return LogoutResult(account: name, state: "logged_out", revoked: revoked)
    }

    // MARK: Configuration

    /// Re-reads the config file and applies it; a broken file changes nothing. Returns the
    /// number of accounts afterwards.
    @discardableResult
    public func reloadConfiguration() throws(BrokerError) -> Int {
        guard let configPath else { return entries.count }
        let configuration: BrokerConfiguration
        do {
            configuration = try ConfigFile.load(path: configPath)
        } catch {
            logger.error("config not reloaded; the running configuration stays", metadata: ["reason": "\(error)"])
            throw BrokerError(.badRequest, "config not reloaded: \(error)")
        }
        try configure(configuration)
        return entries.count
    }

    /// Applies settings and declared accounts. Declared accounts get their provider settings
    /// from the config and keep their secrets; an account no longer declared stays as a
    /// runtime account (nothing secret is ever deleted by editing a file).
    public func configure(_ configuration: BrokerConfiguration) throws(BrokerError) {
        var providers: [String: ProviderConfig] = [:]
        /// Logged-out accounts the config moves elsewhere: their client secret stays behind.
        var moved: Set<String> = []
        for (name, spec) in configuration.accounts {
            do throws(BrokerError) {
                _ = try AccountSpec.validateName(name)
                let provider = try AccountSpec.provider(spec).0
                if let stored = entries[name]?.record, let move = stored.provider.credentialMove(to: provider) {
                    guard !stored.holdsCredential else {
                        throw BrokerError(
                            .badRequest,
                            "the account holds credentials and this \(move); log it out first (brokerctl logout "
                                + "\(name)) or remove it (brokerctl remove \(name))")
                    }
                    moved.insert(name)
                }
                providers[name] = provider
            } catch {
                logger.error("config not applied", metadata: ["account": "\(name)", "reason": "\(error.message)"])
                throw BrokerError(.badRequest, "config not applied: accounts.\(name): \(error.message)")
            }
        }
        settingsBox.withLock { $0 = configuration.settings }
        let now = clock.now()
        let stored = entries.mapValues(\.record)
        for (name, provider) in providers {
            var entry =
                entries[name]
                ?? Entry(
                    record: AccountRecord(
                        name: name, provider: provider, secrets: AccountSecrets(), token: nil, needsLogin: false,
                        lastError: nil, lastRefreshAt: nil))
            if moved.contains(name), entry.record.secrets.clientSecret != nil {
                // A logged-out account may move, but the client secret was issued for the old place.
                entry.record.secrets.clientSecret = nil
                logger.notice(
                    "account moved to another IdP; its client secret was discarded (add the account again to set one)",
                    metadata: ["account": "\(name)"])
            }
            entry.record.provider = provider
            entry.record.declared = true
            if entry.inFlight == nil { entry.nextRefreshAt = Self.schedule(entry.record, planner, now: now) }
            entries[name] = entry
        }
        for (name, entry) in entries where entry.record.declared == true && providers[name] == nil {
            entries[name]?.record.declared = false
            logger.notice(
                "account no longer declared in the config; kept as a runtime account", metadata: ["account": "\(name)"])
        }
        // Usually nothing stored changed (a start with the same file): no vault write then.
        if entries.mapValues(\.record) != stored { try persist(changing: "") }
        logger.info("configuration applied", metadata: ["declared_accounts": "\(providers.count)"])
    }

    // MARK: Scheduling

    /// Starts every refresh that is due and returns when the next one will be. Refreshes found
    /// long overdue (the machine slept, or the wall clock jumped) are spread over the next
    /// `overdueSpread` seconds instead of all hitting the IdPs in the same instant; a client
    /// that needs such an account's token meanwhile gets an on-demand refresh.
    public func runDueRefreshes() -> Date? {
        let now = clock.now()
        var next: Date?
        for (name, entry) in entries {
            guard var due = entry.nextRefreshAt, !entry.loggingOut else { continue }
            if entry.inFlight == nil, !entry.spreadOverdue, now.timeIntervalSince(due) > settings.overdueThreshold {
                due = now.addingTimeInterval(Double.random(in: 0...settings.overdueSpread))
                entries[name]?.nextRefreshAt = due
                entries[name]?.spreadOverdue = true
            }
            if due <= now {
                if entry.inFlight == nil { _ = startRefresh(name) }
            } else {
                next = min(next ?? due, due)
            }
        }
        return next
    }

    /// Waits for refreshes under way, so their vault writes complete before exit.
    public func drain() async {
        for entry in entries.values {
            _ = await entry.inFlight?.task.value
        }
    }

    // MARK: Refresh machinery

    private func refreshShared(_ name: String) async -> Result<Void, BrokerError> {
        guard let entry = entries[name] else { return .failure(notFound(name)) }
        let task = entry.inFlight?.task ?? startRefresh(name)
        return await task.value
    }

    private func startRefresh(_ name: String) -> Task<Result<Void, BrokerError>, Never> {
        refreshSerial += 1
        let serial = refreshSerial
        let task = Task { await self.performRefresh(name, serial: serial) }
        entries[name]?.inFlight = (serial, task)
        entries[name]?.nextRefreshAt = nil
        entries[name]?.spreadOverdue = false
        return task
    }

    private func performRefresh(_ name: String, serial: Int) async -> Result<Void, BrokerError> {
        guard let started = entries[name] else { return .failure(notFound(name)) }
        let provider = makeProvider(started.record.provider)
        let asked = ContinuousClock.now
        // Whatever the IdP or helper wrote is cleaned here, once, before it is stored, logged or sent.
        let outcome = await provider.refresh(started.record, now: clock.now())
            .mapError(started.record.outsideText().clean)
        let answered = ContinuousClock.now
        guard var entry = entries[name], entry.generation == started.generation, entry.inFlight?.serial == serial
        else {
            keepRotatedCredential(name, presented: started.record.secrets, outcome: outcome)
            return .failure(BrokerError(.unavailable, "\(name) changed during the refresh; try again", retryAfterMs: 0))
        }
        entry.inFlight = nil
        let now = clock.now()
        switch outcome {
        case .success(let grant):
            entry.record.token = grant.token
            if let refreshToken = grant.refreshToken {
                // A rotated refresh token carries its own expiry (or none); the old one's no longer applies.
                entry.record.secrets.refreshToken = refreshToken
                entry.record.secrets.refreshExpiresAt = grant.refreshExpiresAt
            } else if let refreshExpiresAt = grant.refreshExpiresAt {
                entry.record.secrets.refreshExpiresAt = refreshExpiresAt
            }
            if let refreshURL = grant.refreshURL { entry.record.secrets.refreshURL = refreshURL }
            entry.record.lastRefreshAt = now
            entry.record.lastError = nil
            entry.failures = 0
            entry.retryAt = nil
            // Never sooner than the minimum interval, so an IdP issuing already-expired tokens
            // is not called in a loop.
            entry.nextRefreshAt = Self.schedule(entry.record, planner, now: now)
                .map { max($0, now.addingTimeInterval(settings.minimumRefreshInterval)) }
            entries[name] = entry
            do {
                try persist(changing: name)
            } catch {
                entries[name]?.nextRefreshAt = now.addingTimeInterval(settings.backoffBase)
                return .failure(error)
            }
            cache.publish(Self.prepare(name, grant.token), for: name)
            events.publish(
                BrokerEvent(event: .refreshed, account: name, at: now, state: "valid", expiresAt: grant.token.expiresAt)
            )
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
        case .failure(let failure) where failure.kind == .denial:
            entry.record.needsLogin = true
            entry.record.lastError = AccountError(code: "needs_login", message: failure.message, at: now)
            entry.nextRefreshAt = nil
            entries[name] = entry
            cache.publish(nil, for: name)
            try? persist(changing: name)
            events.publish(
                BrokerEvent(event: .needsLogin, account: name, at: now, state: "needs_login", message: failure.message))
            logger.warning(
                "refresh denied; needs login", metadata: ["account": "\(name)", "reason": "\(failure.message)"])
            return .failure(needsLogin(name))
        case .failure(let failure):
            entry.failures += 1
            let delay = planner.backoff(failures: entry.failures, retryAfter: failure.retryAfter)
            entry.retryAt = now.addingTimeInterval(delay)
            entry.nextRefreshAt = entry.retryAt
            entry.record.lastError = AccountError(code: "unavailable", message: failure.message, at: now)
            entries[name] = entry
            if entry.failures == 1 {
                events.publish(
                    BrokerEvent(
                        event: .refreshFailed, account: name, at: now, state: state(of: entry, now: now),
                        message: failure.message))
            }
            logger.warning(
                "refresh failed; will retry",
                metadata: [
                    "account": "\(name)", "reason": "\(failure.message)",
                    "retry_in_s": "\(Bounds.wholeSeconds(delay.rounded(.up)))",
                ])
            return .failure(BrokerError(.unavailable, failure.message, retryAfterMs: Bounds.milliseconds(delay)))
        }
    }

    /// A refresh overtaken by `set_tokens` still consumed the refresh token it presented; if the
    /// account still holds that now-dead token, the rotated one replaces it (and is saved).
    private func keepRotatedCredential(
        _ name: String, presented: AccountSecrets, outcome: Result<Grant, RefreshFailure>
    ) {
        guard case .success(let grant) = outcome, let current = entries[name]?.record.secrets else { return }
        var changed = false
        if let rotated = grant.refreshToken, current.refreshToken == presented.refreshToken {
            entries[name]?.record.secrets.refreshToken = rotated
            entries[name]?.record.secrets.refreshExpiresAt = grant.refreshExpiresAt
            changed = true
        }
        if let rotated = grant.refreshURL, current.refreshURL == presented.refreshURL {
            entries[name]?.record.secrets.refreshURL = rotated
            changed = true
        }
        if changed { try? persist(changing: name) }
    }

    private func makeProvider(_ config: ProviderConfig) -> any TokenProvider {
        switch config {
        case .oauth2(let settings):
            return OAuth2Provider(settings: settings, http: http, defaultLifetime: self.settings.defaultLifetime)
        case .refreshURL(let settings):
            return RefreshURLProvider(settings: settings, http: http, defaultLifetime: self.settings.defaultLifetime)
        case .sliding(let settings):
            return SlidingProvider(settings: settings, http: http, defaultLifetime: self.settings.defaultLifetime)
        case .exec(let settings):
            return ExecProvider(
                settings: settings, timeout: self.settings.requestTimeout,
                defaultLifetime: self.settings.defaultLifetime, logger: logger)
        case .static:
            return StaticProvider()
        }
    }

    // MARK: Helpers

    private func entry(_ name: String) throws(BrokerError) -> Entry {
        guard let entry = entries[name] else { throw notFound(name) }
        return entry
    }

    /// Fails fast for accounts that cannot be refreshed now, instead of calling the IdP.
    private func checkRefreshable(_ entry: Entry) throws(BrokerError) {
        let name = entry.record.name
        try checkCredentialUsable(entry)
        if case .static = entry.record.provider {
            throw BrokerError(
                .needsLogin, "\(name) is a static account with no token valid long enough; push one with set_tokens")
        }
        if entry.inFlight == nil, let retryAt = entry.retryAt, retryAt > clock.now() {
            let wait = Bounds.milliseconds(retryAt.timeIntervalSince(clock.now()))
            throw BrokerError(
                .unavailable, entry.record.lastError?.message ?? "the IdP is failing; retrying", retryAfterMs: wait)
        }
    }

    /// Refuses accounts whose credential was denied, discarded, or is being revoked.
    private func checkCredentialUsable(_ entry: Entry) throws(BrokerError) {
        let name = entry.record.name
        if entry.record.loggedOut == true {
            throw BrokerError(.needsLogin, "\(name) is logged out; push new tokens with brokerctl set-tokens \(name)")
        }
        if entry.record.needsLogin { throw needsLogin(name) }
        try checkNotLoggingOut(entry)
    }

    private func checkNotLoggingOut(_ entry: Entry) throws(BrokerError) {
        if entry.loggingOut {
            throw BrokerError(.unavailable, "\(entry.record.name) is being logged out", retryAfterMs: 1000)
        }
    }

    /// Refuses, without calling the IdP, a `minTTL` longer than the lifetime the IdP grants,
    /// while the current token is not yet due for refresh (a refresh could not help).
    private func checkLifetime(_ entry: Entry, covers minTTL: TimeInterval) throws(BrokerError) {
        guard let token = entry.record.token, token.pushed != true, token.expiresAt > clock.now(),
            let due = entry.nextRefreshAt, due > clock.now(),
            token.expiresAt.timeIntervalSince(token.obtainedAt) < minTTL
        else { return }
        let lifetime = Bounds.wholeSeconds(token.expiresAt.timeIntervalSince(token.obtainedAt))
        throw BrokerError(
            .unavailable,
            "the IdP issues tokens valid for \(lifetime) s, less than min_ttl \(Bounds.wholeSeconds(minTTL)) s")
    }

    private func apply(_ tokens: TokenSet, to record: inout AccountRecord, now: Date) throws(BrokerError) {
        if let token = try AccountSpec.accessToken(tokens, now: now, defaultLifetime: settings.defaultLifetime) {
            record.token = token
        }
        if let refreshToken = tokens.refreshToken {
            record.secrets.refreshToken = refreshToken
            record.secrets.refreshExpiresAt = try AccountSpec.refreshExpiry(tokens, now: now)
        }
        if let refreshURL = tokens.refreshURL { record.secrets.refreshURL = refreshURL }
    }

    private func persist(changing name: String) throws(BrokerError) {
        let records = entries.keys.sorted().map { entries[$0]!.record }
        do {
            try vault.save(VaultContents(accounts: records))
        } catch {
            logger.error("cannot save the vault", metadata: ["account": "\(name)", "reason": "\(error)"])
            throw BrokerError(.internal, "the broker cannot save its vault; see its log")
        }
    }

    private func publishAndKick(_ name: String) {
        guard let entry = entries[name] else { return }
        let token = entry.record.needsLogin ? nil : entry.record.token
        cache.publish(token.map { Self.prepare(name, $0) }, for: name)
        if let due = entry.nextRefreshAt, due <= clock.now(), entry.inFlight == nil { _ = startRefresh(name) }
    }

    private static func schedule(_ record: AccountRecord, _ planner: RefreshPlanner, now: Date) -> Date? {
        if record.needsLogin || record.loggedOut == true { return nil }
        if case .static = record.provider { return nil }
        return planner.nextRefresh(token: record.token, refreshExpiresAt: record.secrets.refreshExpiresAt, now: now)
    }

    private static func microseconds(_ duration: Duration) -> Int64 {
        duration.components.seconds * 1_000_000 + duration.components.attoseconds / 1_000_000_000_000
    }

    private static func prepare(_ name: String, _ token: AccessToken) -> PreparedToken {
        PreparedToken(
            TokenResult(
                account: name, accessToken: token.value, tokenType: token.type, expiresAt: token.expiresAt,
                expiresIn: 0, idToken: token.idToken, scope: token.scope))
    }

    private func state(of entry: Entry, now: Date) -> String {
        if entry.record.loggedOut == true { return "logged_out" }
        if entry.record.needsLogin { return "needs_login" }
        if entry.inFlight != nil { return "refreshing" }
        let valid = (entry.record.token?.expiresAt ?? .distantPast) > now
        if case .static = entry.record.provider { return valid ? "valid" : "needs_login" }
        if valid { return entry.failures > 0 ? "stale" : "valid" }
        return entry.failures > 0 ? "unavailable" : "refreshing"
    }

    private func describe(_ entry: Entry, now: Date) -> AccountStatus {
        AccountStatus(
            account: entry.record.name, provider: entry.record.provider.kind, state: state(of: entry, now: now),
            expiresAt: entry.record.token?.expiresAt, refreshExpiresAt: entry.record.secrets.refreshExpiresAt,
            nextRefreshAt: entry.nextRefreshAt, lastRefreshAt: entry.record.lastRefreshAt,
            lastError: entry.record.lastError)
    }

    private func notFound(_ name: String) -> BrokerError {
        BrokerError(.notFound, "no account named \(name); list them with brokerctl status")
    }

    private func needsLogin(_ name: String) -> BrokerError {
        BrokerError(
            .needsLogin, "the IdP denied the refresh for \(name); push new tokens with brokerctl set-tokens \(name)")
    }
}
