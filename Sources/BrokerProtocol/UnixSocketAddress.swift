#if canImport(Glibc)
import Glibc
#endif

/// `sockaddr_un` plumbing shared by the broker, its clients and its tests.
public enum UnixSocketAddress {
    /// Calls `body` with the address of `path` and its length; `nil` when the path is too long.
    public static func withAddress<T>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }

    /// A stream socket connected to `path`, or the reason it could not connect.
    public static func connect(_ path: String) -> Result<Int32, SocketError> {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failure(SocketError(reason: String(cString: strerror(errno)))) }
        let result = withAddress(path) { Glibc.connect(fd, $0, $1) }
        guard result == 0 else {
            let reason = result == nil ? "path too long" : String(cString: strerror(errno))
            close(fd)
            return .failure(SocketError(reason: reason))
        }
        return .success(fd)
    }
}

/// Why a Unix socket could not be used, as the C library said it.
public struct SocketError: Error, CustomStringConvertible, Sendable {
    public let reason: String

    public var description: String { reason }
}

/// The kernel's `struct ucred` (pid, uid, gid), which Swift's Glibc module does not export.
public struct PeerCredentials: Sendable {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32

    /// Who is at the other end of the connected Unix socket `fd` (`SO_PEERCRED`); `nil` when
    /// the kernel does not say.
    public init?(socket fd: Int32) {
        var credentials = PeerCredentials(pid: 0, uid: 0, gid: 0)
        var length = socklen_t(MemoryLayout<PeerCredentials>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 else { return nil }
        self = credentials
    }

    private init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }
}
