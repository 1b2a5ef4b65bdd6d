import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// One HTTP request as a test IdP sees it.
public struct TestHTTPRequest: Sendable {
    public var method: HTTPMethod
    /// The path without the query string, e.g. `/token`.
    public var path: String
    public var query: String?
    public var headers: HTTPHeaders
    public var body: String

    /// The first value of header `name` (case-insensitive).
    public func header(_ name: String) -> String? { headers.first(name: name) }
}

/// How a test IdP answers one request.
public struct TestHTTPResponse: Sendable {
    public var status: HTTPResponseStatus
    public var body: String
    public var headers: [(String, String)]
    /// Wait this long before answering (in process: a timeout at once when it reaches the
    /// request's timeout, see `InProcessIdPNetwork`).
    public var delay: Duration
    /// Never answer (the connection stays open).
    public var hang: Bool
    /// Answer only once this gate is open (then after `delay`).
    public var gate: AnswerGate?

    public init(
        status: HTTPResponseStatus, body: String, headers: [(String, String)] = [], delay: Duration = .zero,
        hang: Bool = false, gate: AnswerGate? = nil
    ) {
        self.status = status
        self.body = body
        self.headers = headers
        self.delay = delay
        self.hang = hang
        self.gate = gate
    }

    /// A response that never comes.
    public static var hanging: TestHTTPResponse { TestHTTPResponse(status: .ok, body: "", hang: true) }

    /// The headers sent: a JSON content type and the length, then `headers`.
    var allHeaders: [(String, String)] {
        [("Content-Type", "application/json"), ("Content-Length", "\(body.utf8.count)")] + headers
    }
}

/// Holds the answers given it until it is opened: a test that must act while the IdP has not
/// answered yet opens it when done, instead of hoping that a delay lasts long enough.
public final class AnswerGate: Sendable {
    private struct State {
        var open = false
        var held: [@Sendable () -> Void] = []
        /// Who waits for how many answers to be held.
        var watchers: [(count: Int, resume: CheckedContinuation<Void, Never>)] = []
    }

    private let state = Mutex(State())

    public init() {}

    /// Runs `answer` once the gate is open: at once if it is.
    func whenOpen(_ answer: @escaping @Sendable () -> Void) {
        let (isOpen, reached) = state.withLock { state in
            if !state.open { state.held.append(answer) }
            let held = state.held.count
            defer { state.watchers.removeAll { $0.count <= held } }
            return (state.open, state.watchers.filter { $0.count <= held }.map(\.resume))
        }
        for watcher in reached { watcher.resume() }
        if isOpen { answer() }
    }

    /// Returns once `count` answers are held (at once if they are): the IdP has received
    /// those requests and they wait for the test, with no time guessed.
    public func holding(_ count: Int) async {
        await withCheckedContinuation { (resume: CheckedContinuation<Void, Never>) in
            let reached = state.withLock { state in
                if state.held.count >= count { return true }
                state.watchers.append((count, resume))
                return false
            }
            if reached { resume.resume() }
        }
    }

    /// Sends the answers held; later ones are not held.
    public func open() {
        let held = state.withLock { state in
            state.open = true
            defer { state.held = [] }
            return state.held
        }
        for answer in held { answer() }
    }
}

/// A real HTTP/1.1 server on 127.0.0.1 (port chosen by the system) that hands every request
/// to `handler`. The plumbing every test IdP served over HTTP shares.
public final class TestHTTPServer: TestIdPHost {
    private let channel: any Channel

    /// Starts listening; `handler` runs on an event loop, so it must not block.
    public init(handler: @escaping @Sendable (TestHTTPRequest) -> TestHTTPResponse) async throws {
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(RequestHandler(handler: handler))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    /// The port the server listens on.
    public var port: Int { channel.localAddress!.port! }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    public var baseURL: String { "http://127.0.0.1:\(port)" }

    /// Stops listening.
    public func shutdown() async {
        try? await channel.close()
    }
}

/// Collects one HTTP request at a time and writes the handler's answer.
private final class RequestHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let handler: @Sendable (TestHTTPRequest) -> TestHTTPResponse
    private var head: HTTPRequestHead?
    private var body = ByteBuffer()

    init(handler: @escaping @Sendable (TestHTTPRequest) -> TestHTTPResponse) {
        self.handler = handler
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            body.clear()
        case .body(var chunk):
            body.writeBuffer(&chunk)
        case .end:
            guard let head else { return }
            let parts = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
            let request = TestHTTPRequest(
                method: head.method, path: String(parts[0]), query: parts.count > 1 ? String(parts[1]) : nil,
                headers: head.headers, body: String(buffer: body))
            let answer = handler(request)
            if answer.hang { return }
            let channel = context.channel
            let respond: @Sendable () -> Void = {
                channel.write(
                    HTTPServerResponsePart.head(
                        HTTPResponseHead(
                            version: .http1_1, status: answer.status, headers: HTTPHeaders(answer.allHeaders))),
                    promise: nil)
                channel.write(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(string: answer.body))), promise: nil)
                channel.writeAndFlush(HTTPServerResponsePart.end(nil), promise: nil)
            }
            let delay = answer.delay
            let send: @Sendable () -> Void = {
                if delay == .zero {
                    respond()
                } else {
                    let (seconds, attoseconds) = delay.components
                    let nanoseconds = seconds * 1_000_000_000 + attoseconds / 1_000_000_000
                    channel.eventLoop.scheduleTask(in: .nanoseconds(nanoseconds)) { respond() }
                }
            }
            if let gate = answer.gate { gate.whenOpen(send) } else { send() }
        }
    }
}

/// `application/x-www-form-urlencoded` parsing for the test IdPs.
enum FormBody {
    static func parse(_ text: String) -> [String: String] {
        var result: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map {
                String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String($0)
            }
            result[parts[0]] = parts.count > 1 ? parts[1] : ""
        }
        return result
    }

    /// `text` with everything but unreserved characters percent-encoded.
    static func escape(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~")))
            ?? ""
    }
}

/// A mutex-protected value that can be shared by reference (a `Mutex` itself cannot be copied).
final class Box<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>

    init(_ value: Value) { mutex = Mutex(value) }

    func withLock<T>(_ body: (inout sending Value) throws -> sending T) rethrows -> T {
        try mutex.withLock(body)
    }
}

/// A random suffix that makes issued tokens and URLs unique per test run.
func randomSuffix() -> String { String(UInt32.random(in: 0...UInt32.max)) }

extension OAuth2TestIdP.Behavior {
    /// The answer a fault imitates (`nil` for `.normal`); `errorBody` is the IdP's own error format.
    func response(errorBody: String) -> TestHTTPResponse? {
        switch self {
        case .normal: return nil
        case .hang: return .hanging
        case .garbage: return TestHTTPResponse(status: .ok, body: "<html>this is not json")
        case .status(let code, let retryAfter):
            return TestHTTPResponse(
                status: HTTPResponseStatus(statusCode: code), body: errorBody,
                headers: retryAfter.map { [("Retry-After", String($0))] } ?? [])
        case .oauthError(let code, let error, let description):
            var object = ["error": error]
            object["error_description"] = description
            let body = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            return TestHTTPResponse(
                status: HTTPResponseStatus(statusCode: code), body: String(decoding: body ?? Data(), as: UTF8.self))
        }
    }
}
