import BrokerProtocol
import Foundation
import Synchronization
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A stand-in for brokerd: a Unix socket in a temporary directory whose connections are served
/// by the test's scripts on a thread of its own, so that the test decides what is answered, in
/// which order and in how many pieces, and when the connection ends. Until the first `serve`
/// nothing accepts (the kernel queues connections: a broker that never answers).
final class FakeBroker: Sendable {
    let socketPath: String
    private let directory: TemporaryDirectory
    private let acceptor: Acceptor

    init() throws {
        directory = try TemporaryDirectory()
        socketPath = directory.file("broker.sock")
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let bound = UnixSocketAddress.withAddress(socketPath) { bind(listener, $0, $1) }
        acceptor = Acceptor(listener: listener)
        guard bound == 0, listen(listener, 8) == 0 else { throw HarnessError("cannot listen on \(socketPath)") }
    }

    deinit {
        acceptor.stop()
        directory.remove()
    }

    /// Runs `script` on the next connection; the task ends with what the script returned or
    /// threw. Scripts take connections in the order they were given, one at a time; a
    /// connection no script waits for is closed at once, so that no client waits for ever.
    func serve<Result: Sendable>(_ script: @escaping @Sendable (Peer) throws -> Result) -> Task<Result, any Error> {
        let (outcome, delivery) = AsyncStream<Swift.Result<Result, any Error>>.makeStream()
        acceptor.enqueue { connection in
            delivery.yield(
                Swift.Result {
                    guard let connection else { throw HarnessError("no client connected") }
                    return try script(Peer(connection))
                })
            delivery.finish()
        }
        return Task {
            for await result in outcome { return try result.get() }
            throw HarnessError("the script ended without an outcome")
        }
    }
}

/// Accepts connections on a thread of its own (started by the first script) and hands each to
/// the next script waiting; the connection closes when its script ends.
private final class Acceptor: Sendable {
    typealias Script = @Sendable (RawConnection?) -> Void

    private let listener: Int32
    private let state = Mutex<(scripts: [Script], started: Bool, stopped: Bool)>(([], false, false))

    init(listener: Int32) { self.listener = listener }

    func enqueue(_ script: @escaping Script) {
        let start = state.withLock { state in
            state.scripts.append(script)
            defer { state.started = true }
            return !state.started
        }
        if start { Thread { self.run() }.start() }
    }

    /// Ends the thread (scripts still waiting get no connection), which closes the listener.
    func stop() {
        let running = state.withLock { state in
            state.stopped = true
            return state.started
        }
        if !running { close(listener) }
    }

    private func run() {
        while !state.withLock({ $0.stopped }) {
            var ready = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&ready, 1, 100) == 1 else { continue }
            let descriptor = accept(listener, nil, nil)
            guard descriptor >= 0 else { continue }
            // Reads wait a minute: on a busy machine the client may be slow to ask.
            let connection = RawConnection(accepted: descriptor, readTimeout: 60)
            let script = state.withLock { $0.scripts.isEmpty ? nil : $0.scripts.removeFirst() }
            script?(connection)
        }
        for script in state.withLock({ $0.scripts }) { script(nil) }
        close(listener)
    }
}

/// The stand-in broker's end of one connection.
struct Peer {
    let connection: RawConnection

    init(_ connection: RawConnection) { self.connection = connection }

    /// The next request line, decoded; throws when the client closed or said nothing for a minute.
    func request() throws -> Request {
        guard let line = connection.readLine() else { throw HarnessError("no request arrived") }
        return try Wire.makeDecoder().decode(Request.self, from: Data(line))
    }

    /// Writes `text` as it is (no newline is added).
    func write(_ text: String) {
        connection.send(text)
    }

    /// Keeps the stand-in broker silent for `milliseconds` on its own thread, as a real one is
    /// between the lines it sends (the client's reads and its `idle` meet that silence).
    func pause(milliseconds: Int) {
        usleep(UInt32(milliseconds * 1000))
    }

    /// The success line answering `id` with `result` (a JSON object's text), newline included.
    static func answer(_ id: RequestID?, result: String) -> String {
        #"{"id":\#(json(id)),"ok":true,"result":\#(result)}"# + "\n"
    }

    /// The failure line answering `id` (`nil`: an error about the connection itself).
    static func failure(_ id: RequestID?, code: String, message: String, retryAfterMs: Int? = nil) -> String {
        let retry = retryAfterMs.map { #","retry_after_ms":\#($0)"# } ?? ""
        return #"{"id":\#(json(id)),"ok":false,"error":{"code":"\#(code)","message":"\#(message)"\#(retry)}}"# + "\n"
    }

    /// A token result for `account`, as brokerd sends it.
    static func token(account: String?, accessToken: String) -> String {
        #"{"account":"\#(account ?? "")","access_token":"\#(accessToken)","token_type":"Bearer","#
            + #""expires_at":"2030-01-01T00:00:00Z","expires_in":3600}"#
    }

    /// Ends the connection at once, in both directions.
    func hangUp() {
        shutdown(connection.descriptor, Int32(SHUT_RDWR))
    }

    /// The client's process id (`SO_PEERCRED`).
    var clientPID: Int32? { PeerCredentials(socket: connection.descriptor)?.pid }

    private static func json(_ id: RequestID?) -> String {
        guard let id, let data = try? JSONEncoder().encode(id) else { return "null" }
        return String(decoding: data, as: UTF8.self)
    }
}
