import Foundation

/// A raw TCP connection to `127.0.0.1:port` that the test holds open (as a hostile local
/// process would), sending only what it is told to, to watch when the other side closes it.
public struct HeldConnection: Sendable {
    private let fd: Int32

    /// Connects; throws when the port refuses.
    public init(port: Int) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
        guard connected else {
            let error = errno
            Glibc.close(fd)
            throw HarnessError("connect to 127.0.0.1:\(port): errno \(error)")
        }
    }

    /// Sends `bytes`, as far as the peer takes them; `false` once it no longer does.
    @discardableResult
    public func send(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } == bytes.count
    }

    /// Whether the peer has closed the connection (end of stream or reset), after discarding
    /// anything it sent first; never blocks.
    public var isClosedByPeer: Bool {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count == 0 { return true }
            if count < 0 { return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR }
        }
    }

    /// Closes the test's end.
    public func close() { Glibc.close(fd) }
}
