import BrokerIdP
import BrokerModel
import BrokerSecrets
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The exclusive lock that makes one broker per vault: a POSIX record lock (`F_SETLK`) on the
/// vault's lock file, held from `init` until `deinit`.
///
/// Not `flock`: a flock belongs to the open file, which every child this process spawns
/// shares from its fork until its exec, so a vault closed and opened again here (a restarted
/// rekey, a test) could find its own lock still held by a child being started. A record lock
/// belongs to the process and is never inherited. Record locks do not exclude each other
/// within one process, so `held` does that, by the lock file's device and inode.
package final class VaultLock: Sendable {
    private struct FileIdentity: Hashable {
        let device: UInt64
        let inode: UInt64
    }

    /// The lock files this process holds a lock on.
    private static let held = Mutex<Set<FileIdentity>>([])

    private let descriptor: Int32
    private let identity: FileIdentity

    /// Takes the lock on `path` (created private if missing, see `FileSystem.openPrivateFile`),
    /// or throws the refusal naming `vaultPath` if another vault object or process holds it.
    package init(path: String, vaultPath: String) throws {
        let fd = try FileSystem.openPrivateFile(path, role: "vault lock", flags: O_RDWR | O_CREAT)
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            close(fd)
            throw VaultError("cannot read the vault lock \(path): \(FileSystem.errnoText())")
        }
        let identity = FileIdentity(device: UInt64(info.st_dev), inode: UInt64(info.st_ino))
        var range = flock()
        range.l_type = Int16(F_WRLCK)
        range.l_whence = Int16(SEEK_SET)
        guard Self.held.withLock({ $0.insert(identity).inserted }) else {
            close(fd)
            throw Self.refusal(vaultPath)
        }
        guard fcntl(fd, F_SETLK, &range) == 0 else {
            let held = errno == EACCES || errno == EAGAIN
            let error = held ? Self.refusal(vaultPath) : VaultError("cannot lock \(path): \(FileSystem.errnoText())")
            Self.held.withLock { _ = $0.remove(identity) }
            close(fd)
            throw error
        }
        descriptor = fd
        self.identity = identity
    }

    deinit {
        // Closed and forgotten as one step under `held`'s lock: forgotten after the close, an
        // unlinked lock file's inode could meanwhile be given to another vault's new lock file
        // (ext4 does) and refused as held; forgotten before it, this process could lock the same
        // file again, and the close would then drop that new lock (record locks are per process).
        Self.held.withLock { held in
            close(descriptor)
            _ = held.remove(identity)
        }
    }

    private static func refusal(_ vaultPath: String) -> VaultError {
        VaultError(
            "another brokerd is already using the vault \(vaultPath); stop it first (two brokers would burn one-time refresh tokens)"
        )
    }
}
