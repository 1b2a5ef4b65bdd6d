import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault

#if canImport(Glibc)
import Glibc
#endif

/// The directory the broker's socket lives in, made ready before binding.
enum SocketDirectory {
    /// Makes the socket's directory one that no other user can change (see
    /// `FileSystem.preparePrivateDirectory`: created 0700, nothing followed through a link,
    /// nothing chmod'ed), so no one can swap the socket for an impostor's. Then removes a
    /// stale socket, refusing to replace one another broker still answers on, or anything
    /// that is not a socket.
    static func prepare(_ path: String) throws {
        try FileSystem.preparePrivateDirectory(
            FileSystem.parent(of: path), role: "socket directory",
            remedy: "set XDG_RUNTIME_DIR, or TOKENBROKER_SOCKET (or --socket), to a path in a directory only you "
                + "can write")
        var info = stat()
        guard lstat(path, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFSOCK else {
            throw ServerError(
                description: "\(path) exists and is not a socket; remove it or choose another socket path")
        }
        if SocketProbe.isAnswering(path) {
            throw ServerError(description: "another broker is already listening on \(path)")
        }
        unlink(path)
    }
}

/// Checks whether something answers on a Unix socket path.
enum SocketProbe {
    static func isAnswering(_ path: String) -> Bool {
        guard case .success(let fd) = UnixSocketAddress.connect(path) else { return false }
        close(fd)
        return true
    }
}
