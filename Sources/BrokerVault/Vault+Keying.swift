import BrokerIdP
import BrokerModel
import BrokerSecrets
import FoundationEssentials
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The vault's key: taken at start (the key file), derived from a passphrase at unlock,
/// forgotten at lock, replaced by a rekey.
extension Vault {
    /// How a rekey seals the vault.
    public enum Rekey: Sendable {
        /// Under a key derived from a passphrase (a new one, when the vault has one already).
        case passphrase(PassphraseKey)
        /// Under the key file's key: the file at `keyFile` is read, or created first.
        case keyFile
    }

    /// The points of a rekey after which a crash leaves files that the old or the new key opens
    /// (the test of each stops there).
    package enum RekeyStep: CaseIterable {
        /// A log under the old key was folded into a snapshot, and removed durably.
        case compacted
        /// The key file to move to is on disk.
        case keyFileWritten
        /// The snapshot under the new key is written and fsync'd beside the old one.
        case staged
        /// It replaced the old one (before the directory's fsync and the old log's removal).
        case renamed
        /// The key file the vault left was removed.
        case keyFileRemoved
    }

    /// Whether the vault holds no key: nothing can be read or saved until `unlock(with:)`.
    public var isLocked: Bool { state.withLock { $0.key == nil } }

    /// The key the vault is sealed with now; `nil` while it is locked.
    public var keyMode: VaultKeyMode? { state.withLock { $0.key?.mode } }

    /// How the vault on disk is sealed, from its snapshot's header; `nil` when there is none yet.
    public func sealing() throws -> VaultKeyMode? {
        try storedHeader().map { $0.derivation == nil ? .keyFile : .passphrase }
    }

    /// Takes the key the vault needs and returns how it is sealed: the key file's key (read, or
    /// created unless it is a systemd credential) when the vault is sealed with it, or when there
    /// is no vault and `configured` is the key file. A vault sealed with a passphrase, or none
    /// yet when a passphrase is configured, stays locked until `unlock(with:)`. A vault sealed
    /// with the key file is refused when a passphrase is configured: the passphrase someone
    /// asked for is never dropped silently (a vault put in its place cannot turn it off).
    public func prepareKey(configured: VaultKeyMode) throws -> VaultKeyMode {
        switch (try sealing(), configured) {
        case (.passphrase, _), (nil, .passphrase):
            return .passphrase
        case (.keyFile, .passphrase):
            throw VaultError(
                "the vault \(path) is sealed with the key file, not a passphrase; start brokerd without --passphrase "
                    + "(and without key = \"passphrase\" in broker.toml), then run brokerctl rekey --to passphrase")
        case (.keyFile, .keyFile), (nil, .keyFile):
            let key = try readKeyFile()
            state.withLock { $0.key = .keyFile(key) }
            return .keyFile
        }
    }

    /// The derivation to derive the passphrase's key with: the one in the snapshot's header, or a
    /// fresh one when there is no vault yet (`isNew`: the first unlock sets the passphrase).
    public func passphraseDerivation() throws -> (derivation: KeyDerivation, isNew: Bool) {
        guard let header = try storedHeader() else { return (.fresh(), true) }
        guard let derivation = header.derivation else {
            throw VaultError("the vault \(path) is sealed with the key file, not a passphrase")
        }
        return (derivation, false)
    }

    /// The header of the snapshot on disk; `nil` when there is none yet. Reads only as much of
    /// the file as the longest header and a tag (the whole snapshot is read again by `load`).
    private func storedHeader() throws -> (version: UInt16, derivation: KeyDerivation?)? {
        let limit = VaultSnapshot.passphraseHeaderLength + Sodium.tagLength
        guard let file = try FileSystem.readPrivateFile(path, role: "vault", limit: limit) else { return nil }
        return try VaultSnapshot.header([UInt8](file), path: path)
    }

    /// Takes `key` and reads the vault with it (see `load`); a vault that does not exist yet is
    /// created at once, empty, under `key`, so the passphrase is set. A key the files do not
    /// authenticate is not kept (`VaultError.wrongKey` when the snapshot refused it).
    public func unlock(with key: PassphraseKey) throws -> VaultContents? {
        state.withLock { $0.key = .passphrase(key) }
        do {
            guard let contents = try load() else {
                try save(VaultContents(accounts: []))
                return nil
            }
            return contents
        } catch {
            lock()
            throw error
        }
    }

    /// Forgets the key (its guarded memory is wiped as it is freed) and every account read from
    /// the files; the vault stays this broker's (its lock is kept).
    public func lock() {
        state.withLock { state in
            state.closeLog()
            state = State()
        }
    }

    /// Seals every account under a new key, atomically: a crash at any instant leaves files that
    /// the old or the new key opens. In order: a log under the old key is folded into a snapshot
    /// and removed durably (no log may outlive its key); a key file to move to is read, or
    /// written and made durable; the snapshot under the new key is staged, fsync'd and renamed
    /// over the old one, the directory fsync'd; last, a key file the vault no longer needs is
    /// removed. Returns the key file it had to leave (a systemd credential), if any.
    public func rekey(to target: Rekey) throws -> String? {
        try rekey(to: target) { _ in }
    }

    /// `rekey(to:)`, calling `checkpoint` after each step; a checkpoint that throws stops the
    /// rekey there, leaving the files as a crash would.
    package func rekey(to target: Rekey, checkpoint: (RekeyStep) throws -> Void) throws -> String? {
        try state.withLock { state in
            guard state.loaded, let old = state.key else { throw Self.locked }
            if state.log != nil || access(logPath, F_OK) == 0 {
                try writeSnapshot(state.accounts, state.damaged, &state)
                try FileSystem.syncDirectory(of: path)
            }
            try checkpoint(.compacted)
            let new: SealingKey
            switch target {
            case .passphrase(let key):
                new = .passphrase(key)
            case .keyFile:
                guard old.mode == .passphrase else { throw VaultError("the vault is sealed with the key file already") }
                new = .keyFile(try readKeyFile(durably: true))
                try checkpoint(.keyFileWritten)
            }
            try writeSnapshot(state.accounts, state.damaged, &state, key: new, checkpoint: checkpoint)
            guard old.mode == .keyFile, new.mode == .passphrase, let keyFile else { return nil }
            guard !keyFile.isCredential, unlink(keyFile.path) == 0 || errno == ENOENT else { return keyFile.path }
            try? FileSystem.syncDirectory(of: keyFile.path)
            try checkpoint(.keyFileRemoved)
            return nil
        }
    }

    /// The key file's key: read, or created (unless it is a systemd credential); when `durably`,
    /// a key file created here is made durable (its directory fsync'd) before it is used.
    private func readKeyFile(durably: Bool = false) throws -> SecretKey {
        guard let keyFile else { throw VaultError("this vault was opened without a key file location") }
        let existed = access(keyFile.path, F_OK) == 0
        let key = try VaultKey.load(path: keyFile.path, create: !keyFile.isCredential)
        if durably, !existed { try FileSystem.syncDirectory(of: keyFile.path) }
        return key
    }
}
