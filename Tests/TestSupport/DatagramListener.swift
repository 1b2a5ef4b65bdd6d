import BrokerProtocol

#if canImport(Glibc)
import Glibc
#endif

/// A datagram socket standing in for systemd's notify socket.
public final class DatagramListener {
    public let descriptor: Int32
    public let path: String

    public init(path: String) throws {
        self.path = path
        descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        let result = UnixSocketAddress.withAddress(path) { bind(descriptor, $0, $1) }
        guard result == 0 else { throw HarnessError("cannot bind \(path)") }
    }

    deinit {
        close(descriptor)
        unlink(path)
    }

    /// The next datagram already queued, as text, without waiting; nil when none is.
    public func receiveQueued() -> String? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = recv(descriptor, &buffer, buffer.count, Int32(MSG_DONTWAIT))
        return count > 0 ? String(decoding: buffer[..<count], as: UTF8.self) : nil
    }

    /// The next datagram as text, or nil after `timeout` seconds.
    public func receive(timeout: Int = 30) -> String? {
        var limit = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = recv(descriptor, &buffer, buffer.count, 0)
        return count > 0 ? String(decoding: buffer[..<count], as: UTF8.self) : nil
    }
}
