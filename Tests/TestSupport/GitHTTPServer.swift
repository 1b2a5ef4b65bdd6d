import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// A git server on 127.0.0.1 speaking git's dumb HTTP protocol: it serves the files of the bare
/// repositories under `root` (made ready with `git update-server-info`) to requests that give,
/// by HTTP Basic auth, a password `accepts` takes. Unless `refusesFirst` is false, the first
/// accepted password is refused once (401), as a server that has just revoked a token would, so
/// git erases it and asks again.
public final class GitHTTPServer: Sendable {
    /// One request's credentials and what the server answered.
    public struct Attempt: Sendable, Equatable {
        public var username: String?
        public var password: String?
        public var status: Int
    }

    struct State {
        var attempts: [Attempt] = []
        var refusedOnce = false
    }

    private let channel: any Channel
    private let state: Box<State>

    public init(root: String, refusesFirst: Bool = true, accepts: @escaping @Sendable (String) -> Bool)
        async throws
    {
        let state = Box(State(refusedOnce: !refusesFirst))
        self.state = state
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(
                        GitFileHandler { head in Self.answer(head, root: root, accepts: accepts, state: state) })
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    /// The port the server listens on.
    public var port: Int { channel.localAddress!.port! }

    /// Every request with credentials, in order.
    public var attempts: [Attempt] { state.withLock { $0.attempts } }

    public func shutdown() async {
        try? await channel.close()
    }

    private static func answer(
        _ head: HTTPRequestHead, root: String, accepts: @Sendable (String) -> Bool, state: Box<State>
    ) -> (HTTPResponseStatus, [UInt8]) {
        let path = String(head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)[0])
        let credentials = head.headers.first(name: "Authorization").flatMap(basic)
        let status: HTTPResponseStatus = state.withLock { state in
            let status: HTTPResponseStatus
            if let password = credentials?.password, accepts(password) {
                status = state.refusedOnce ? .ok : .unauthorized
                state.refusedOnce = true
            } else {
                status = .unauthorized
            }
            if let credentials {
                state.attempts.append(
                    Attempt(username: credentials.username, password: credentials.password, status: Int(status.code)))
            }
            return status
        }
        guard status == .ok else { return (status, []) }
        guard head.method == .GET, !path.contains(".."),
            let bytes = FileManager.default.contents(atPath: root + path)
        else { return (.notFound, []) }
        return (.ok, Array(bytes))
    }

    /// The user name and password of a `Basic` Authorization header.
    private static func basic(_ header: String) -> (username: String, password: String)? {
        guard header.hasPrefix("Basic "), let data = Data(base64Encoded: String(header.dropFirst(6))) else {
            return nil
        }
        let text = String(decoding: data, as: UTF8.self)
        guard let colon = text.firstIndex(of: ":") else { return nil }
        return (String(text[..<colon]), String(text[text.index(after: colon)...]))
    }
}

/// Answers each request with the status and bytes `answer` gives (401s ask for Basic auth).
private final class GitFileHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let answer: @Sendable (HTTPRequestHead) -> (HTTPResponseStatus, [UInt8])
    private var head: HTTPRequestHead?

    init(answer: @escaping @Sendable (HTTPRequestHead) -> (HTTPResponseStatus, [UInt8])) {
        self.answer = answer
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): self.head = head
        case .body: break
        case .end:
            guard let head else { return }
            let (status, bytes) = answer(head)
            var headers = HTTPHeaders([
                ("Content-Type", "application/octet-stream"), ("Content-Length", "\(bytes.count)"),
            ])
            if status == .unauthorized { headers.add(name: "WWW-Authenticate", value: "Basic realm=\"git\"") }
            context.write(
                wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))),
                promise: nil)
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: bytes)))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
    }
}
