import BrokerProtocol
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The directory the broker's socket lives in, made ready before binding.
enum SocketDirectory {
    /// Creates the socket's directory (0700) and removes a stale socket file, refusing to
    /// replace one that another broker is still answering on.
    static func prepare(_ path: String) throws {
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
        try? FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        guard chmod(directory, 0o700) == 0 else {
            throw ServerError(description: "cannot use the socket directory \(directory): \(String(cString: strerror(errno)))")
        }
        guard FileManager.default.fileExists(atPath: path) else { return }
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
