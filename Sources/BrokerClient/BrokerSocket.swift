import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// The broker could not be reached, or the connection to it broke.
public struct ConnectionError: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// The broker was reached but did not answer before the deadline: it may still be at work
    /// (refreshing at a slow IdP), unlike one that is not running.
    public let timedOut: Bool

    public init(description: String, timedOut: Bool = false) {
        self.description = description
        self.timedOut = timedOut
    }
}

/// Blocking Unix-socket primitives both clients use.
enum BrokerSocket {
    /// A socket connected to the broker at `path`, served by this user or root. Checked
    /// (`SO_PEERCRED`) before a byte is sent: a socket another user planted or swapped in, to
    /// collect the secrets brokerctl sends, is closed and refused.
    static func connect(_ path: String) throws(ConnectionError) -> Int32 {
        switch UnixSocketAddress.connect(path) {
        case .success(let fd):
            do {
                try checkServer(fd, path: path)
                return fd
            } catch {
                close(fd)
                throw error
            }
        case .failure(let error):
            let paths = DefaultPaths()
            let fallback = path == paths.socket ? paths.socketFallback.map { "; \($0)" } ?? "" : ""
            throw ConnectionError(
                description: "the broker is not running at \(path) (\(error))\(fallback); start it with brokerd")
        }
    }

    /// Refuses a server that is neither this user nor root.
    private static func checkServer(_ fd: Int32, path: String) throws(ConnectionError) {
        guard let server = PeerCredentials(socket: fd)?.uid else {
            let reason = String(cString: strerror(errno))
            throw ConnectionError(
                description: "cannot tell who serves the socket \(path) (\(reason)); nothing was sent")
        }
        guard server == getuid() || server == 0 else {
            throw ConnectionError(
                description: "refusing the socket \(path): it is served by uid \(server), not by you (uid \(getuid())) "
                    + "or root, so it is not your broker (another user may have planted it); nothing was sent. "
                    + "Check who owns its directory, and TOKENBROKER_SOCKET and XDG_RUNTIME_DIR")
        }
    }

    /// Sends all of `data`; `false` when the broker went away (no `SIGPIPE` is raised).
    static func send(_ fd: Int32, _ data: Data) -> Bool {
        data.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let written = Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                if written < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                offset += written
            }
            return true
        }
    }
}

/// The answer lines of one connection, read with blocking `read`s on the caller's thread.
struct LineReader {
    /// The longest answer line accepted (a `status` of thousands of accounts fits many times).
    static let maximumLineLength = 16 << 20

    let descriptor: Int32
    /// Bytes read and not yet returned start at `start`; no newline is before `searched`.
    private var buffer: [UInt8] = []
    private var start = 0
    private var searched = 0
    private var chunk = [UInt8](repeating: 0, count: 65536)

    init(descriptor: Int32) { self.descriptor = descriptor }

    /// What one wait for a line ended with.
    enum Outcome {
        /// A line, without its newline.
        case line(Data)
        /// The end of the stream.
        case end
        /// The wait's deadline passed first (a partial line stays buffered).
        case timedOut
    }

    /// The next line without its newline; `nil` at the end of the stream. Waits for it until
    /// `deadline` (forever when `nil`), then throws.
    mutating func next(deadline: ContinuousClock.Instant? = nil) throws(ConnectionError) -> Data? {
        switch try read(until: deadline) {
        case .line(let line): return line
        case .end: return nil
        case .timedOut: throw ConnectionError(description: "the broker did not answer in time", timedOut: true)
        }
    }

    /// The next line, the end of the stream, or `timedOut` once `deadline` passes (never when `nil`).
    mutating func read(until deadline: ContinuousClock.Instant?) throws(ConnectionError) -> Outcome {
        while true {
            if let newline = buffer[searched...].firstIndex(of: 0x0A) {
                let line = Data(buffer[start..<newline])
                start = newline + 1
                searched = start
                return .line(line)
            }
            guard buffer.count - start <= Self.maximumLineLength else {
                throw ConnectionError(description: "the broker sent a line longer than 16 MiB")
            }
            if let deadline, try !wait(until: deadline) { return .timedOut }
            let count = Glibc.read(descriptor, &chunk, chunk.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw ConnectionError(
                    description: "reading from the broker failed: \(String(cString: strerror(errno)))")
            }
            if count == 0 { return .end }
            // What was returned goes before more is read, so the buffer holds one partial line at most.
            buffer.removeFirst(start)
            start = 0
            searched = buffer.count
            buffer += chunk[..<count]
        }
    }

    /// Waits until the socket is readable (`true`) or `deadline` passes (`false`).
    private func wait(until deadline: ContinuousClock.Instant) throws(ConnectionError) -> Bool {
        while true {
            let left = ContinuousClock.now.duration(to: deadline)
            let milliseconds = left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000
            guard milliseconds > 0 else { return false }
            var ready = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            let result = poll(&ready, 1, Int32(clamping: milliseconds))
            if result > 0 { return true }
            if result < 0, errno != EINTR {
                throw ConnectionError(description: "waiting for the broker failed: \(String(cString: strerror(errno)))")
            }
        }
    }
}
