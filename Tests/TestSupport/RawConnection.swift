import BrokerProtocol
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A bare Unix-socket connection for sending arbitrary bytes, well-formed or not (either end:
/// a client of a broker, or a stand-in broker's end of a connection). One task or thread uses
/// it at a time; the async reads wait on a thread of their own, not on one of the few threads
/// every test's tasks share.
public final class RawConnection: @unchecked Sendable {
    public let descriptor: Int32
    private var buffer = [UInt8]()

    /// Connects to `path`; each read waits `readTimeout` seconds at most.
    public init(path: String, readTimeout: Int = 10) throws {
        descriptor = try Self.connect(path, readTimeout: readTimeout)
    }

    /// Connects once something listens at `path`, trying for up to `seconds`.
    public init(path: String, waitingUpTo seconds: Double) throws {
        var connected: Int32?
        guard
            Poll.blocking(
                timeout: seconds,
                {
                    connected = try? Self.connect(path); return connected != nil
                }),
            let connected
        else { throw HarnessError("nothing listens on \(path)") }
        descriptor = connected
    }

    /// The server end of a connection accepted on a test's own listener (a stand-in broker),
    /// whose reads wait `readTimeout` seconds at most.
    public init(accepted descriptor: Int32, readTimeout: Int = 10) {
        self.descriptor = descriptor
        Self.limitReads(descriptor, seconds: readTimeout)
    }

    private static func connect(_ path: String, readTimeout: Int = 10) throws -> Int32 {
        guard case .success(let descriptor) = UnixSocketAddress.connect(path) else {
            throw HarnessError("cannot connect to \(path)")
        }
        limitReads(descriptor, seconds: readTimeout)
        return descriptor
    }

    /// A read waits `seconds` at most, so that a test never hangs on a silent peer.
    private static func limitReads(_ descriptor: Int32, seconds: Int = 10) {
        var timeout = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(descriptor) }

    /// Writes all bytes; returns false if the peer has gone away.
    @discardableResult
    public func send(_ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes {
                Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if written <= 0 { return false }
            offset += written
        }
        return true
    }

    @discardableResult
    public func send(_ text: String) -> Bool { send(Array(text.utf8)) }

    /// Sends `line` and its newline; returns the next line as text (nil when the connection
    /// closed or timed out).
    public func request(_ line: String) -> String? {
        guard send(line + "\n"), let answer = readLine() else { return nil }
        return String(decoding: answer, as: UTF8.self)
    }

    /// The next line as a JSON object, or nil when the connection closed (or timed out).
    public func readObject() -> [String: Any]? {
        guard let line = readLine() else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any]
    }

    /// The next line as a JSON object, waited for on a thread of its own, not on one of the few
    /// threads every test's tasks share (a read may wait its whole timeout); nil when the
    /// connection closed (or timed out).
    public func nextObject() async -> [String: Any]? {
        guard let line = (try? await onOwnThread { self.readLine() }) ?? nil else { return nil }
        return (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any]
    }

    /// The next line's bytes, or nil at end of stream.
    public func readLine() -> [UInt8]? {
        while true {
            if let newline = buffer.firstIndex(of: 0x0A) {
                let line = Array(buffer[..<newline])
                buffer.removeFirst(newline + 1)
                return line
            }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let count = recv(descriptor, &chunk, chunk.count, 0)
            if count <= 0 { return nil }
            buffer += chunk[..<count]
        }
    }

    /// Whether the broker has closed this connection (reads end of stream).
    public func isClosedByPeer() -> Bool {
        while readLine() != nil {}
        return true
    }

    /// Whether something (a line or the end) arrives within `seconds`.
    public func hasData(within seconds: Double) -> Bool {
        guard buffer.isEmpty else { return true }
        var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        return poll(&poller, 1, Int32(seconds * 1000)) > 0
    }

    /// Waits up to `seconds` for the broker to close the connection, discarding what it sends
    /// meanwhile; false if it is still open then.
    public func waitForClose(seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        var chunk = [UInt8](repeating: 0, count: 65536)
        while Date() < deadline {
            var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 100) > 0 else { continue }
            let count = recv(descriptor, &chunk, chunk.count, Int32(MSG_DONTWAIT))
            if count == 0 || (count < 0 && errno != EAGAIN && errno != EINTR) { return true }
        }
        return false
    }

    /// Writes as much of `bytes` as the broker takes within `seconds` of a stall; returns how
    /// many bytes were written.
    public func sendUntilStalled(_ bytes: [UInt8], seconds: Int) -> Int {
        var timeout = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes {
                Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if written <= 0 { break }
            offset += written
        }
        return offset
    }
}

extension Dictionary where Key == String, Value == Any {
    /// `error.code` of a failure line.
    public var errorCode: String? { (self["error"] as? [String: Any])?["code"] as? String }
}
