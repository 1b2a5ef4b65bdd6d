import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// Login coordination: signing a user in at an IdP, then storing what it grants.
extension Broker {
    /// Signs the user in at the IdP of `account` and stores the tokens it issues: creates the
    /// account with `provider` (and `clientSecret`) when it does not exist, otherwise restores it
    /// in place with its own settings, as `setTokens` would. Waits for the user off the actor;
    /// `progress` receives what to show them. While a login of the account runs, this one joins
    /// it (`RunningLogin`): a `joined` progress, then that login's progress and outcome; a
    /// provider or client secret given must be the running login's. The flow is cancelled, and
    /// stores nothing, once every login taking part in it was cancelled.
    public func login(
        _ account: AccountName, provider: ProviderConfig?, clientSecret: SecretBytes?, options: LoginOptions,
        progress: @escaping @Sendable (LoginProgress) async -> Void
    ) async throws(BrokerFailure) -> (snapshot: AccountSnapshot, hasIDToken: Bool) {
        let name = account.rawValue
        loginParticipants += 1
        let participant = loginParticipants
        let updates: RunningLogin.Updates
        if var running = logins[name] {
            if let provider, provider != running.provider { throw .loginSettingsDiffer(account) }
            if let clientSecret, clientSecret != running.clientSecret { throw .loginSettingsDiffer(account) }
            updates = running.add(participant, joining: true)
            logins[name] = running
        } else {
            let (config, secret) = try loginSettings(account, provider: provider, clientSecret: clientSecret)
            guard let settings = config.settings as? OAuth2Settings else {
                throw .invalid("\(name) is a \(config.kind) account; only oauth2 accounts can log in")
            }
            var running = RunningLogin(
                serial: participant, flow: options.flow, provider: config, clientSecret: secret)
            updates = running.add(participant, joining: false)
            running.task = Task {
                let outcome: Result<RunningLogin.Outcome, BrokerFailure>
                do throws(BrokerFailure) {
                    outcome = .success(
                        try await runLogin(
                            account, config: config, settings: settings, clientSecret: secret, options: options,
                            serial: participant))
                } catch {
                    outcome = .failure(error)
                }
                guard let ended = logins[name], ended.serial == participant else { return }
                logins[name] = nil
                ended.finish(outcome)
            }
            logins[name] = running
        }
        for await update in updates {
            switch update {
            case .progress(let line): await progress(line)
            case .finished(let outcome): return try outcome.get()
            }
        }
        // The stream ended without an outcome: this login was cancelled. The last one to leave
        // answers once the flow stopped (no more polling, the listener closed).
        if var running = logins[name], running.participants[participant] != nil {
            if running.remove(participant) {
                running.task?.cancel()
                logins[name] = nil
                await running.task?.value
            } else {
                logins[name] = running
            }
        }
        throw .loginFailed(account, reason: "the login was cancelled")
    }

    /// Runs the flow of login `serial` of `account` and stores what it grants; its progress
    /// goes to the login's participants.
    private func runLogin(
        _ account: AccountName, config: ProviderConfig, settings: OAuth2Settings, clientSecret secret: SecretBytes?,
        options: LoginOptions, serial: Int
    ) async throws(BrokerFailure) -> RunningLogin.Outcome {
        let name = account.rawValue
        let restoring = accounts[name] != nil
        // A shared account's tokens go to its row (`replaceSharedTokens`) once the flow is over.
        let shared = isShared(name)
        var sharedGrant: Grant?
        // The key the IdP binds the tokens to: the account's own, or one made for it now.
        var dpopKey = settings.dpop == nil ? nil : accounts[name]?.record.secrets.dpopKey
        if settings.dpop != nil, dpopKey == nil { dpopKey = try DPoPKey.generate() }
        let context = LoginContext(
            account: account, settings: settings, clientSecret: secret, dpopKey: dpopKey, http: http, clock: clock,
            defaultLifetime: self.settings.defaultLifetime,
            progress: { progress in await self.reportLogin(progress, of: name, serial: serial) },
            accountExists: restoring, accountDeclared: accounts[name]?.record.declared == true)
        /// Stores what the IdP granted (saved to the vault before it returns).
        func keep(_ grant: Grant) throws(BrokerFailure) -> RunningLogin.Outcome {
            if Task.isCancelled { throw context.cancelled }
            // The account may have been added, removed or reconfigured while the user signed in; a
            // removed one stays removed.
            if restoring && accounts[name] == nil { throw .noSuchAccount(account) }
            _ = try loginSettings(account, provider: config, clientSecret: secret)
            let snapshot: AccountSnapshot
            if shared {
                sharedGrant = grant
                snapshot = describe(try machine(name), now: clock.now())
            } else if accounts[name] == nil {
                snapshot = try create(account, provider: config, clientSecret: secret) { record, _ in
                    apply(grant, to: &record, dpopKey: dpopKey)
                }
            } else {
                snapshot = try replaceTokens(of: account) { record, _ in apply(grant, to: &record, dpopKey: dpopKey) }
            }
            logger.info("logged in", metadata: ["account": "\(name)", "flow": "\(options.flow.rawValue)"])
            return (snapshot, grant.token.idToken != nil)
        }
        let kept: RunningLogin.Outcome
        switch options.flow {
        case .device: kept = try keep(try await DeviceAuthorization.run(context, timeout: options.timeout))
        case .browser:
            // The browser's page answers after the tokens are saved, with how that went.
            kept = try await AuthorizationCodeLogin.run(
                context, redirectPort: options.redirectPort, timeout: options.timeout, keep: keep)
        }
        guard let grant = sharedGrant else { return kept }
        let snapshot = try await replaceSharedTokens(of: account) { record, _ in
            apply(grant, to: &record, dpopKey: dpopKey)
        }
        return (snapshot, kept.hasIDToken)
    }

    /// Passes `progress` of login `serial` of account `name` to its participants.
    private func reportLogin(_ progress: LoginProgress, of name: String, serial: Int) {
        guard logins[name]?.serial == serial else { return }
        logins[name]?.report(progress)
    }

    /// The settings and client secret a login of `account` uses: an existing account's own
    /// (a provider or secret given must be the same), else the ones given.
    package func loginSettings(_ account: AccountName, provider: ProviderConfig?, clientSecret: SecretBytes?)
        throws(BrokerFailure) -> (ProviderConfig, SecretBytes?)
    {
        guard let machine = accounts[account.rawValue] else {
            guard let provider else { throw .loginNeedsProvider(account) }
            return (provider, clientSecret)
        }
        try checkChangeable(machine)
        let record = machine.record
        if let provider, provider != record.provider { throw .loginSettingsDiffer(account) }
        if let clientSecret, clientSecret != record.secrets.clientSecret { throw .loginSettingsDiffer(account) }
        return (record.provider, record.secrets.clientSecret)
    }
}
