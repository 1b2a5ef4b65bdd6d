import BrokerProtocol
import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A stand-in for brokerd: a Unix socket in a temporary directory whose connections are served
/// by the test's script on a thread of its own, so that the test decides what is answered, in
/// which order and in how many pieces, and when the connection ends.
final class FakeBroker: Sendable {
    let socketPath: String
    private let directory: TemporaryDirectory
    private let listener: Int32

    init() throws {
        directory = try TemporaryDirectory()
        socketPath = directory.file("broker.sock")
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        let bound = UnixSocketAddress.withAddress(socketPath) { bind(listener, $0, $1) }
        guard bound == 0, listen(listener, 8) == 0 else { throw HarnessError("cannot listen on \(socketPath)") }
    }

    deinit {
        close(listener)
        directory.remove()
    }

    /// Accepts the next connection (within 10 seconds) and runs `script` on it, on a thread of
    /// its own started at once (a test that blocks in the blocking client holds no task the
    /// script needs); the task ends with what the script returned or threw. The connection is
    /// closed when the script ends.
    func serve<Result: Sendable>(_ script: @escaping @Sendable (Peer) throws -> Result) -> Task<Result, any Error> {
        let (outcome, delivery) = AsyncStream<Swift.Result<Result, any Error>>.makeStream()
        Thread {
            delivery.yield(Swift.Result { try script(Peer(self.accept())) })
            delivery.finish()
        }.start()
        return Task {
            for await result in outcome { return try result.get() }
            throw HarnessError("the script ended without an outcome")
        }
    }

    private func accept() throws -> RawConnection {
        var ready = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
        guard poll(&ready, 1, 10_000) == 1 else { throw HarnessError("no client connected") }
        let descriptor = Glibc.accept(listener, nil, nil)
        guard descriptor >= 0 else { throw HarnessError("accept failed: errno \(errno)") }
        return RawConnection(accepted: descriptor)
    }
}

/// The stand-in broker's end of one connection.
struct Peer {
    let connection: RawConnection

    init(_ connection: RawConnection) { self.connection = connection }

    /// The next request line, decoded; throws when the client closed or said nothing for 10 s.
    func request() throws -> Request {
        guard let line = connection.readLine() else { throw HarnessError("no request arrived") }
        return try Wire.makeDecoder().decode(Request.self, from: Data(line))
    }

    /// Writes `text` as it is (no newline is added).
    func write(_ text: String) {
        connection.send(text)
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
