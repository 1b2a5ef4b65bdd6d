import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging
import Synchronization

/// Configuration: `broker.toml` applied in one place, at start and at every reload.
extension Broker {
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
            // Declared anew, it would replace the record the vault keeps (protocol/VAULT.md).
            if let record = damaged[name]?.record {
                logger.error(
                    "a declared account's record in the vault cannot be read; it is not served",
                    metadata: ["account": "\(name)", "reason": "\(record.reason)"])
                continue
            }
            do throws(BrokerFailure) {
                let account = try AccountName(name)
                let provider = try ProviderConfig.checking(
                    spec, holdsClientSecret: accounts[name]?.record.secrets.clientSecret != nil
                ).0
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
        let stored = accounts.machines.mapValues(\.record)
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
        let undeclared = accounts.machines.keys.filter {
            accounts[$0]?.record.declared == true && providers[$0] == nil
        }
        for name in undeclared {
            accounts[name]?.undeclared()
            logger.notice(
                "account no longer declared in the config; kept as a runtime account", metadata: ["account": "\(name)"])
        }
        // New settings, or a declared account's new provider settings: every provider is built
        // afresh (a refresh under way finishes with the provider it started with).
        tokenProviders = [:]
        for name in Array(accounts.machines.keys) { accounts[name]?.restartPolling() }
        let wlcgFile = configuration.wlcgAccount == nil ? nil : DefaultPaths().wlcgBearerTokenFile
        if configuration.wlcgAccount != nil, wlcgFile == nil {
            logger.warning("wlcg_account ignored: no XDG_RUNTIME_DIR (nor /run/user/UID) to hold bt_u$UID")
        }
        let filePaths = TokenFiles.paths(for: configuration, wlcgFile: wlcgFile)
        rewriteTokenFiles(of: tokenFiles.replace(with: filePaths, logger: logger))
        // Usually nothing stored changed (a start with the same file): no vault write then.
        let changed = accounts.machines.filter { stored[$0.key] != $0.value.record }.keys
        if !changed.isEmpty { try persist(changing: changed) }
        // A token served is prepared with the IdP endpoints and `dpop_allow` of its settings
        // (`DPoPIdPEndpoints`): new settings prepare it again.
        for (name, provider) in providers
        where stored[name].map({ !$0.provider.settings.isEqual(to: provider.settings) }) == true {
            try run([.publish(accounts[name]?.servableToken)], for: name)
        }
        logger.info("configuration applied", metadata: ["declared_accounts": "\(providers.count)"])
    }

    /// Writes the token files of `names` from their accounts' servable tokens (removes them
    /// for an account that has none).
    package func rewriteTokenFiles(of names: some Sequence<String>) {
        for name in names { tokenFiles.update(name, token: accounts[name]?.servableToken, logger: logger) }
    }
}
