import BrokerIdP
import BrokerModel
import BrokerSecrets
import FoundationEssentials
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A vault problem, with a message that says what to do; never contains a secret.
public struct VaultError: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// Whether the snapshot did not authenticate under the key given: the key (or passphrase)
    /// is wrong, or the file was modified.
    public let wrongKey: Bool

    package init(_ description: String, wrongKey: Bool = false) {
        self.description = description
        self.wrongKey = wrongKey
    }
}

/// The encrypted files holding every account and secret: a snapshot of every account
/// (`VaultSnapshot`, at `path`) and a log of the changes saved since (`VaultLog`, at
/// `logPath`), so a save writes what changed, not every account.
///
/// A save appends one sealed record to the log and waits for `fdatasync`; once the log has
/// grown to a quarter of the snapshot, the next save writes a new snapshot instead (staging file,
/// fsync, rename, fsync of the directory), which starts the log afresh; one that cannot be
/// written (a full disk) leaves the change to the log. The log keeps room allocated ahead for
/// its next records (`ensureRoom`), so saves go on for a while on a full disk. A crash at any
/// instant loses nothing a save returned for: `load` reads the snapshot, completes a staged
/// one, replays the log and drops only a record that a crash cut short. Opening a vault takes
/// an exclusive lock, so a second broker on the same vault refuses to start instead of burning
/// one-time refresh tokens.
///
/// The key is the key file's, or one derived from a passphrase (`unlock`), held only while the
/// vault is unlocked: `lock` forgets it with every account read. `rekey` moves the vault to
/// another key atomically.
public final class Vault: @unchecked Sendable {
    /// The log length from which the next save writes a snapshot: a quarter of the snapshot's,
    /// so a start reads at most a quarter more than the snapshot and a snapshot's cost is shared
    /// by many saves; at least 32 KiB, so a small vault is not rewritten every few saves.
    package static func compactionLength(snapshotLength: Int) -> Int { max(snapshotLength / 4, 32 * 1024) }
    /// The space allocated ahead of the log's end (protocol/VAULT.md, "Room for the next
    /// records"): room for dozens of records, so that saves go on for a while on a full disk.
    package static let reserveLength = 256 * 1024
    /// The room a refresh needs before it starts (`ensureRoom`): a record of one account whose
    /// tokens take tens of KiB.
    package static let roomForARefresh = 64 * 1024

    public let path: String
    /// Where the key file is (or would be): read under the key file, written by a rekey to it,
    /// removed by a rekey from it. `nil` when the key is handed over (`init(path:key:)`).
    package let keyFile: KeyFile?
    /// Held while this object lives: one broker per vault.
    private let exclusiveLock: VaultLock
    package let state = Mutex(State())

    /// The refusal of a change, or a read, while the vault holds no key.
    package static let locked = VaultError("the vault is locked; unlock it first")

    /// What the vault knows of its files.
    package struct State {
        /// The key the files are sealed with; `nil` while the vault is locked.
        package var key: SealingKey?
        /// Every account, by name, as the files hold it.
        package var accounts: [String: AccountRecord] = [:]
        /// The account objects this release cannot read, by name, kept as the files hold them.
        package var damaged: [String: DamagedRecord] = [:]
        /// Set once the accounts are those of the files (by `load` or a whole `save`).
        package var loaded = false
        /// The generation, header nonce and size of the snapshot at `path`, if there is one.
        package var snapshot: (generation: UInt64, nonce: [UInt8], length: Int)?
        /// The log continuing that snapshot, open for writing; `nil` until it is needed.
        package var log: (fd: Int32, header: [UInt8], tail: VaultLog.Tail)?
        /// Where the space allocated ahead for the log ends (`reserveLog`).
        package var reservedEnd = 0
        /// Cleared when the filesystem cannot allocate ahead: there is no reserve to wait for.
        package var allocatesAhead = true
        /// The record of a save whose write or `fdatasync` failed, where the log would end after
        /// it, and its change: the next save writes a snapshot holding it, or, when it cannot,
        /// writes these very bytes again at the same place first (protocol/VAULT.md).
        package var unsynced: (record: [UInt8], tail: VaultLog.Tail, change: VaultChange)?
        /// Whether the last `load` completed an interrupted save.
        package var recovered = false
        /// The format the last `load` converted, if it did.
        package var convertedVersion: UInt16?

        /// Whether the next save writes a whole snapshot instead of appending to the log.
        package var needsSnapshot: Bool {
            guard let snapshot, unsynced == nil else { return true }
            return (log?.tail.length ?? 0) >= Vault.compactionLength(snapshotLength: snapshot.length)
        }

        /// The bytes reserved beyond the log's last saved record (unbounded without allocation ahead).
        package var room: Int {
            guard allocatesAhead else { return .max }
            guard let log else { return 0 }
            return max(0, reservedEnd - log.tail.length)
        }

        package mutating func closeLog() {
            if let fd = log?.fd { close(fd) }
            log = nil
            reservedEnd = 0
            unsynced = nil
        }
    }

    /// Opens (without reading) the vault at `path` sealed with `key`, the key file's key,
    /// creating its directory (see `FileSystem.preparePrivateDirectory`), and takes its lock.
    public convenience init(path: String, key: SecretKey) throws {
        try self.init(path: path)
        state.withLock { $0.key = .keyFile(key) }
    }

    /// Opens (without reading) the vault at `path`, creating its directory (see
    /// `FileSystem.preparePrivateDirectory`), and takes its lock; its key file is `keyFile`. It
    /// holds no key yet: see `prepareKey(configured:)` and `unlock(with:)`.
    public init(path: String, keyFile: KeyFile? = nil) throws {
        self.path = path
        self.keyFile = keyFile
        try FileSystem.preparePrivateDirectory(
            FileSystem.parent(of: path), role: "vault directory",
            remedy: "set TOKENBROKER_VAULT (or --vault) to a path in a directory only you can write")
        exclusiveLock = try VaultLock(path: path + ".lock", vaultPath: path)
    }

    deinit {
        state.withLock { $0.closeLog() }
    }

    /// Where a new snapshot is written before it is renamed over `path`.
    package var stagingPath: String { path + ".next" }
    /// Where the changes since the snapshot are appended.
    package var logPath: String { path + ".log" }

    /// Whether the last `load` completed a save that a crash had interrupted.
    public var recoveredInterruptedSave: Bool { state.withLock { $0.recovered } }

    /// The format version the last `load` found and rewrote in today's format, if it did.
    public var convertedFormatVersion: UInt16? { state.withLock { $0.convertedVersion } }

    /// Reads and decrypts the vault: the snapshot, then every change in the log; `nil` when no
    /// vault exists yet. A wrong key or a modified file is refused and every file is left
    /// untouched. What a crash left behind is settled here, after everything was read: a
    /// staging file that authenticates and is the very next snapshot is promoted (any other
    /// staging file, torn, foreign, stale, not private or a link, is deleted, never followed);
    /// a log that a newer snapshot replaced is deleted; a record cut short at the end of the log
    /// is cut away. A vault in format 1 (one file) is rewritten in today's format.
    public func load() throws -> VaultContents? {
        try state.withLock { state in
            guard let key = state.key?.secret else { throw Self.locked }
            state.closeLog()
            state = State(key: state.key)
            // The secrets read are stored in guarded memory in batches (see `SecretArena`).
            let reader = VaultJSONReader()
            let (current, staged) = try SecretArena.shared.storing {
                (
                    try readSnapshot(path, key: key, reader: reader),
                    try? readSnapshot(stagingPath, key: key, reader: reader)
                )
            }
            let promoting = staged.map {
                $0.generation == (current?.generation ?? 0) + 1 && $0.version >= (current?.version ?? 0)
            }
            guard let snapshot = promoting == true ? staged : current else {
                guard try FileSystem.readPrivateFile(logPath, role: "vault log") == nil else {
                    throw VaultError(
                        "the vault log \(logPath) is there but not the vault \(path) it continues; it was left untouched "
                            + "(remove it to start with an empty vault)")
                }
                unlink(stagingPath)
                state.loaded = true
                return nil
            }
            let log = try SecretArena.shared.storing { try readLog(continuing: snapshot, key: key, reader: reader) }

            // Everything is read and authenticated: settle what a crash left behind.
            if promoting == true {
                try FileSystem.promote(stagingPath, to: path)
                state.recovered = true
            } else {
                unlink(stagingPath)
            }
            state.snapshot = (snapshot.generation, snapshot.nonce, snapshot.length)
            state.accounts = Dictionary(snapshot.contents.accounts.map { ($0.name, $0) }) { $1 }
            state.damaged = Dictionary(snapshot.contents.damaged.map { ($0.name, $0) }) { $1 }
            if let log, case .changes(let changes, let header, let tail) = log.reading {
                for change in changes { change.apply(to: &state.accounts, &state.damaged) }
                state.log = (log.fd, header, tail)
                if tail.length < log.length {
                    try FileSystem.truncateDurably(log.fd, to: tail.length, role: "vault log", path: logPath)
                }
                // Renewed here and at the next saves; a full disk is met by `ensureRoom`.
                try? reserveLog(&state)
            } else if let log {
                // Superseded, or cut short while it was started: the snapshot has all there is.
                close(log.fd)
                unlink(logPath)
            }
            if snapshot.version == VaultSnapshot.singleFileVersion {
                try writeSnapshot(state.accounts, state.damaged, &state)
                state.convertedVersion = snapshot.version
            }
            state.loaded = true
            return VaultContents(
                accounts: state.accounts.values.sorted { $0.name < $1.name },
                damaged: state.damaged.values.sorted { $0.name < $1.name })
        }
    }

    /// Saves a change to some accounts, durably before it returns: `changed` are written whole
    /// (each replacing a damaged record of its name) and `removed` deleted (damaged records
    /// too), all or nothing; the damaged records not named stay as they are. The cost grows with the change, not with the
    /// vault: one record appended to the log (or, when the log has grown long enough, a new
    /// snapshot). The vault must have been loaded first.
    public func save(changed: [AccountRecord], removed: [String]) throws {
        try state.withLock { state in
            guard state.loaded else { throw VaultError("the vault \(path) was not loaded before a change to it") }
            guard !changed.isEmpty || !removed.isEmpty else { return }
            let change = VaultChange(changed: changed, removed: removed)
            if state.needsSnapshot {
                var accounts = state.accounts
                var damaged = state.damaged
                state.unsynced?.change.apply(to: &accounts, &damaged)
                change.apply(to: &accounts, &damaged)
                let generation = state.snapshot?.generation
                do {
                    return try writeSnapshot(accounts, damaged, &state)
                } catch  where generation != nil && state.snapshot?.generation == generation {
                    // Not written (no room for it, say), the old snapshot still current: the log
                    // takes the change, and the next save tries the snapshot again.
                }
            }
            try append(change, &state)
            change.apply(to: &state.accounts, &state.damaged)
        }
    }

    /// Makes sure the next save has room for its record (protocol/VAULT.md, "Room for the next
    /// records"): starts the log if there is none and renews its reserve when it runs low.
    /// Throws what stands in the way once less than `roomForARefresh` is left, so a refresh
    /// that would rotate a credential is not started when its record could not be written.
    package func ensureRoom() throws {
        try state.withLock { state in
            guard state.loaded, state.snapshot != nil, state.key != nil else { return }
            if state.log == nil { try startLog(&state) }
            guard state.room < Self.reserveLength / 2 else { return }
            do {
                try reserveLog(&state)
            } catch  where state.room >= Self.roomForARefresh {}
        }
    }

    /// Replaces every account with `contents`: a new snapshot, written atomically and durably
    /// (staging file, fsync, rename, fsync of the directory), with an empty log.
    public func save(_ contents: VaultContents) throws {
        try state.withLock { state in
            try writeSnapshot(
                Dictionary(contents.accounts.map { ($0.name, $0) }) { $1 },
                Dictionary(contents.damaged.map { ($0.name, $0) }) { $1 }, &state)
            state.loaded = true
        }
    }

    /// Reads, authenticates and decodes one snapshot file; `nil` when it does not exist. The
    /// file must be a private regular file of this user (see `FileSystem.openPrivateFile`).
    private func readSnapshot(_ path: String, key: SecretKey, reader: VaultJSONReader) throws -> VaultSnapshot? {
        guard let file = try FileSystem.readPrivateFile(path, role: "vault") else { return nil }
        return try VaultSnapshot.open([UInt8](file), path: path, key: key, reader: reader)
    }

    /// The log, open for appending, its length and what it holds beside `snapshot`; `nil` when
    /// there is none. Nothing is changed.
    private func readLog(continuing snapshot: VaultSnapshot, key: SecretKey, reader: VaultJSONReader) throws -> (
        fd: Int32, length: Int, reading: VaultLog.Reading
    )? {
        guard
            let (fd, content) = try FileSystem.openAndReadPrivateFile(
                logPath, role: "vault log", flags: O_RDWR)
        else { return nil }
        do {
            return (
                fd, content.count,
                try VaultLog.read([UInt8](content), continuing: snapshot, path: logPath, key: key, reader: reader)
            )
        } catch {
            close(fd)
            throw error
        }
    }

    /// Writes `accounts` and `damaged` as the next snapshot, sealed with `key` (by default the vault's), and
    /// drops the log, which it replaces. Once the rename is done, `state` follows the files
    /// (`key` included) even if a later step fails. `checkpoint` is called once the staging file
    /// is durable and once it is renamed (a rekey's test stops there).
    package func writeSnapshot(
        _ accounts: [String: AccountRecord], _ damaged: [String: DamagedRecord], _ state: inout State,
        key: SealingKey? = nil,
        checkpoint: (RekeyStep) throws -> Void = { _ in }
    ) throws {
        guard let key = key ?? state.key else { throw Self.locked }
        let generation = (state.snapshot?.generation ?? 0) + 1
        let contents = VaultContents(
            accounts: accounts.values.sorted { $0.name < $1.name }, damaged: damaged.values.sorted { $0.name < $1.name }
        )
        let (file, nonce) = try VaultSnapshot.seal(
            contents, generation: generation, key: key.secret, derivation: key.derivation)
        try FileSystem.writeStagingFile(file, at: stagingPath)
        try checkpoint(.staged)
        do {
            try FileSystem.replace(path, with: stagingPath)
        } catch {
            unlink(stagingPath)
            throw error
        }
        state.key = key
        try checkpoint(.renamed)
        state.closeLog()
        state.snapshot = (generation, nonce, file.count)
        state.accounts = accounts
        state.damaged = damaged
        try FileSystem.syncDirectory(of: path)
        // Only now that the new snapshot is durable: until then the old log may be needed.
        unlink(logPath)
    }

    /// Appends `change` to the log, starting the log first if there is none; durable on return.
    /// A record whose write or `fdatasync` failed is written again first, byte for byte at the
    /// same place: the page cache is not trusted once a write or `fdatasync` failed, and a kill
    /// during the rewrite leaves the same bytes (protocol/VAULT.md, "Room for the next records").
    private func append(_ change: VaultChange, _ state: inout State) throws {
        guard let key = state.key?.secret else { throw Self.locked }
        if state.log == nil { try startLog(&state) }
        if let unsynced = state.unsynced, let log = state.log {
            try FileSystem.writeDurably(
                unsynced.record, to: log.fd, at: log.tail.length, role: "vault log", path: logPath)
            state.unsynced = nil
            state.log?.tail = unsynced.tail
            unsynced.change.apply(to: &state.accounts, &state.damaged)
        }
        guard let log = state.log else { preconditionFailure("a started log is open") }
        let (record, tail) = try VaultLog.seal(change, header: log.header, after: log.tail, key: key)
        do {
            try FileSystem.writeDurably(record, to: log.fd, at: log.tail.length, role: "vault log", path: logPath)
        } catch {
            state.unsynced = (record, tail, change)
            throw error
        }
        state.log?.tail = tail
        if state.room < Self.reserveLength / 2 { try? reserveLog(&state) }
    }

    /// Starts the log continuing the snapshot: its header, durable under a durable name, then
    /// its reserve. A log that cannot be started is removed.
    private func startLog(_ state: inout State) throws {
        guard let snapshot = state.snapshot else { preconditionFailure("a log continues a snapshot") }
        guard let key = state.key?.secret else { throw Self.locked }
        let (header, start) = VaultLog.header(generation: snapshot.generation, snapshotNonce: snapshot.nonce, key: key)
        let fd = try FileSystem.createPrivateFile(logPath, role: "vault log")
        do {
            try FileSystem.writeDurably(header, to: fd, at: 0, role: "vault log", path: logPath)
            try FileSystem.syncDirectory(of: logPath)
        } catch {
            close(fd)
            unlink(logPath)
            throw error
        }
        state.log = (fd, header, start)
        try? reserveLog(&state)
    }

    /// Allocates `reserveLength` bytes ahead of the log's last saved record, beyond the end of
    /// the file (its size unchanged), so the records written there need no new blocks. A
    /// filesystem that cannot allocate ahead has no reserve, and no limit on starting refreshes.
    private func reserveLog(_ state: inout State) throws {
        guard let log = state.log, state.allocatesAhead else { return }
        if let refusal = FileSystem.allocateAhead(log.fd, from: log.tail.length, length: Self.reserveLength) {
            guard refusal.unsupported else {
                throw VaultError("cannot reserve room for the vault's next records (\(logPath): \(refusal.reason))")
            }
            state.allocatesAhead = false
            return
        }
        state.reservedEnd = log.tail.length + Self.reserveLength
    }
}

/// Everything the vault holds.
public struct VaultContents: Sendable, Equatable {
    public var accounts: [AccountRecord]
    /// The account objects this release cannot read, kept as they are (protocol/VAULT.md).
    public var damaged: [DamagedRecord]

    public init(accounts: [AccountRecord], damaged: [DamagedRecord] = []) {
        self.accounts = accounts
        self.damaged = damaged
    }
}
