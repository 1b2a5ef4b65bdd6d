import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging
import NIOPosix

/// Passphrase mode: unlocking the vault, locking it again, moving it to another key.
extension Broker {
    /// What `unlock(with:)` did.
    public enum UnlockOutcome: Sendable, Equatable {
        /// The vault was opened; `created` when there was none and the passphrase was set.
        case unlocked(accounts: Int, created: Bool)
        /// The broker held its key already; the passphrase was not looked at.
        case alreadyUnlocked
    }

    /// Derives the vault key from `passphrase` (off the actor, one derivation at a time), opens
    /// the vault with it, schedules every account (refreshes that came due meanwhile run at the
    /// scheduler's next pass) and applies the configuration given while locked. A vault that
    /// does not exist yet is created, so the first unlock sets the passphrase. A wrong
    /// passphrase is answered after a delay, 1 s doubling with each wrong one in a row up to
    /// 30 s, during which no other unlock is tried.
    public nonisolated func unlock(with passphrase: SecretBytes?) async throws(BrokerFailure) -> UnlockOutcome {
        var bytes = try Self.bytes(of: passphrase)
        defer { Sodium.wipe(&bytes) }
        switch padlock.phase {
        case .unlocked: return .alreadyUnlocked
        case .locking: throw .keyDerivationRunning
        case .locked: break
        }
        guard padlock.beginDerivation() else { throw .keyDerivationRunning }
        defer { padlock.endDerivation() }
        // What a restart cut short of the last wrong passphrase's delay is waited out first.
        let left = padlock.takeRestoredWait(now: clock.now())
        if left > .zero {
            logger.notice(
                "unlock waits out the delay of a wrong passphrase given before a restart",
                metadata: ["wait": "\(left)"])
            await clock.sleep(for: left)
        }
        let (derivation, isNew) = try await vaultDerivation()
        let key = try await Self.derive(bytes, with: derivation)
        do {
            let count = try await open(with: key)
            padlock.succeeded()
            saveUnlockPace(UnlockPaceFile.Pace(failures: 0, until: clock.now()))
            return .unlocked(accounts: count, created: isNew)
        } catch .wrongPassphrase {
            let delay = padlock.failed()
            // Saved before the wait: a broker killed meanwhile still makes the next unlock wait.
            saveUnlockPace(
                UnlockPaceFile.Pace(
                    failures: padlock.failures, until: clock.now().addingTimeInterval(Double(delay.components.seconds)))
            )
            logger.warning("unlock refused: wrong passphrase", metadata: ["delay_s": "\(delay.components.seconds)"])
            // Not cancelled with the request: a client that hangs up does not shorten the wait.
            await clock.sleep(for: delay)
            throw .wrongPassphrase
        }
    }

    /// Has `padlock` take up the pace of unlock attempts a previous run left in `file`. A file
    /// that cannot be trusted or read counts as the longest delay, from `now`.
    package static func restoreUnlockPace(from file: UnlockPaceFile, into padlock: Padlock, now: Date, logger: Logger) {
        let longest = Double(Padlock.longestDelay.components.seconds)
        do {
            if let pace = try file.read(now: now, longest: longest) { padlock.restore(pace) }
        } catch {
            logger.warning(
                "unlock pace file unusable: the next unlock waits the longest delay", metadata: ["reason": "\(error)"])
            padlock.restore(
                UnlockPaceFile.Pace(failures: UnlockPaceFile.maximumFailures, until: now.addingTimeInterval(longest)))
        }
    }

    /// Keeps `pace` beside the vault; a failure is logged (the pace in memory holds until a restart).
    private nonisolated func saveUnlockPace(_ pace: UnlockPaceFile.Pace) {
        do {
            try unlockPace.save(pace)
        } catch {
            logger.error("cannot save the unlock pace", metadata: ["reason": "\(error)"])
        }
    }

    /// Forgets the vault key and every decrypted secret: waits for refreshes under way (so a
    /// rotated credential is saved), then drops every token served, every account's record and
    /// provider, and the vault's key and records; keeps each account's name and provider kind
    /// for `status`. Returns `false` when the broker was locked already. Refused under the key
    /// file, which stays on disk.
    public func lock() async throws(BrokerFailure) -> Bool {
        guard padlock.phase == .unlocked else { return false }
        guard vault.keyMode == .passphrase else {
            throw .invalid(
                "the vault is sealed with the key file, not a passphrase; run brokerctl rekey --to passphrase")
        }
        padlock.enter(.locking)
        cache.removeAll()
        tokenFiles.removeAll(logger: logger)
        for running in refreshTasks.values { _ = await running.task.value }
        for running in narrowedRefreshes.values { _ = await running.value }
        if !unsaved.isEmpty, (try? persist(changing: [])) == nil {
            logger.error("locked with changes the vault could not save", metadata: ["accounts": "\(unsaved.count)"])
        }
        forgetFleetAtLock()
        let shown = accounts.machines.values.map {
            Padlock.LockedAccount(name: $0.record.name, kind: $0.record.provider.kind)
        }
        padlock.enter(.locked, known: shown)
        accounts.replaceAll(with: [:])
        damaged = [:]
        tokenProviders = [:]
        refreshTasks = [:]
        narrowedRefreshes = [:]
        narrowedBackoffs = [:]
        unsaved = []
        vault.lock()
        logger.notice("locked", metadata: ["accounts": "\(shown.count)"])
        return true
    }

    /// Seals the vault under a key derived from `passphrase` (a fresh salt), or under the key
    /// file (`passphrase` is then ignored), atomically (see `Vault.rekey(to:)`). The broker stays
    /// unlocked. Returns the key file that could not be removed (a systemd credential), if any.
    public nonisolated func rekey(to mode: VaultKeyMode, passphrase: SecretBytes?) async throws(BrokerFailure)
        -> String?
    {
        guard padlock.phase == .unlocked else { throw .locked }
        var bytes = try mode == .passphrase ? Self.bytes(of: passphrase) : []
        defer { Sodium.wipe(&bytes) }
        guard padlock.beginDerivation() else { throw .keyDerivationRunning }
        defer { padlock.endDerivation() }
        switch mode {
        case .keyFile: return try await reseal(to: .keyFile)
        case .passphrase: return try await reseal(to: .passphrase(Self.derive(bytes, with: .fresh())))
        }
    }

    /// A copy of `passphrase` for the key derivation (the caller wipes it), which must be 1 to
    /// `maximumPassphraseLength` bytes long.
    private static func bytes(of passphrase: SecretBytes?) throws(BrokerFailure) -> [UInt8] {
        guard let passphrase, !passphrase.isEmpty else { throw .invalid("the field \"passphrase\" is required") }
        guard passphrase.count <= maximumPassphraseLength else {
            throw .invalid("a passphrase is at most \(maximumPassphraseLength) bytes")
        }
        return passphrase.withUnsafeBytes { Array($0) }
    }

    /// The derivation the vault's header names, or a fresh one when there is no vault yet.
    private func vaultDerivation() throws(BrokerFailure) -> (KeyDerivation, isNew: Bool) {
        do {
            return try vault.passphraseDerivation()
        } catch {
            logger.error("cannot unlock", metadata: ["reason": "\(error)"])
            throw .vaultUnusable(reason: "\(error)")
        }
    }

    /// Opens the vault with `key` and takes over its accounts; returns how many there are.
    private func open(with key: PassphraseKey) throws(BrokerFailure) -> Int {
        let contents: VaultContents?
        do {
            contents = try vault.unlock(with: key)
        } catch let error as VaultError where error.wrongKey {
            throw .wrongPassphrase
        } catch {
            logger.error("cannot unlock", metadata: ["reason": "\(error)"])
            throw .vaultUnusable(reason: "\(error)")
        }
        Self.reportLoad(of: vault, logger: logger)
        accounts.replaceAll(
            with: Self.machines(for: contents, settings: settings, cache: cache, http: http, now: clock.now()))
        heldForFleet = Self.heldForFleet(in: contents)
        damaged = Self.damaged(in: contents, now: clock.now(), logger: logger)
        padlock.enter(.unlocked)
        if let configuration = pendingConfiguration {
            pendingConfiguration = nil
            do {
                try configure(configuration)
            } catch {
                logger.error(
                    "config not applied at unlock; the vault's accounts stand", metadata: ["reason": "\(error)"])
                rewriteTokenFiles(of: tokenFiles.paths.keys)
            }
        } else {
            rewriteTokenFiles(of: tokenFiles.paths.keys)
        }
        logger.notice("unlocked", metadata: ["accounts": "\(accounts.count)"])
        return accounts.count
    }

    /// Moves the vault to `target` while the broker is unlocked.
    private func reseal(to target: Vault.Rekey) throws(BrokerFailure) -> String? {
        guard padlock.phase == .unlocked else { throw .locked }
        let mode: VaultKeyMode
        switch target {
        case .keyFile:
            guard vault.keyMode != .keyFile else { throw .invalid("the vault is sealed with the key file already") }
            mode = .keyFile
        case .passphrase: mode = .passphrase
        }
        do {
            let left = try vault.rekey(to: target)
            logger.notice("vault re-encrypted", metadata: ["key": "\(mode.rawValue)"])
            if let left {
                logger.warning(
                    "the key file the vault no longer uses could not be removed (a systemd credential?)",
                    metadata: ["key_file": "\(left)"])
            }
            return left
        } catch {
            logger.error("vault not re-encrypted", metadata: ["reason": "\(error)"])
            throw .vaultNotSaved
        }
    }

    /// The key of `passphrase` under `derivation`, derived on NIO's blocking thread pool.
    private static func derive(_ passphrase: [UInt8], with derivation: KeyDerivation) async throws(BrokerFailure)
        -> PassphraseKey
    {
        do {
            return try await NIOThreadPool.singleton.runIfActive {
                try PassphraseKey.derive(passphrase, with: derivation)
            }
        } catch {
            throw .vaultUnusable(reason: "cannot derive the vault key: \(error)")
        }
    }
}
