import FoundationEssentials
import NIOCore
import NIOHTTP1
import NIOPosix

/// The loopback listener of a browser login (RFC 8252 section 7.3): HTTP/1 on
/// `127.0.0.1:<port>`, answering only `GET /callback`. A callback with the wrong or no `state`
/// gets a 400 page and changes nothing (anyone on the machine can reach the port); the first
/// one with the right `state` ends the wait with its `code` or its `error`.
final class LoopbackRedirect: Sendable {
    /// What the browser brought back with the right `state`.
    enum Callback: Sendable, Equatable {
        case code(String)
        case error(String)
    }

    /// Longest `code` or `error` taken from a callback, in bytes.
    static let maximumValue = 4096

    let port: Int
    private let channel: any Channel
    private let callbacks: AsyncStream<Callback>

    /// The URI the IdP redirects the browser to.
    var redirectURI: String { "http://127.0.0.1:\(port)/callback" }

    /// Listens on `127.0.0.1:port` (`0`: a free port) for the callback carrying `state`.
    init(port: Int, state: String) async throws(BrokerFailure) {
        let (callbacks, continuation) = AsyncStream.makeStream(of: Callback.self, bufferingPolicy: .bufferingNewest(1))
        do {
            channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.backlog, value: 16)
                .childChannelInitializer { child in
                    child.eventLoop.makeCompletedFuture {
                        try child.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                        try child.pipeline.syncOperations.addHandler(
                            CallbackHandler(state: state, continuation: continuation))
                    }
                }
                .bind(host: "127.0.0.1", port: port).get()
        } catch {
            continuation.finish()
            throw .invalid(
                "cannot listen on 127.0.0.1:\(port) for the redirect (\(error)); choose another --redirect-port")
        }
        self.callbacks = callbacks
        self.port = channel.localAddress?.port ?? port
    }

    /// The callback with the right `state`, or `nil` when `deadline` passed or the task was cancelled first.
    func callback(until deadline: ContinuousClock.Instant) async -> Callback? {
        await withTaskGroup(of: Callback?.self) { group in
            group.addTask { [callbacks] in
                var iterator = callbacks.makeAsyncIterator()
                return await iterator.next()
            }
            group.addTask {
                try? await Task.sleep(until: deadline, clock: .continuous)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }

    /// Stops listening: the port refuses connections from here on.
    func close() async {
        try? await channel.close()
    }
}

/// Answers each request on one connection to the listener, and closes the connection after it.
private final class CallbackHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let state: String
    private let continuation: AsyncStream<LoopbackRedirect.Callback>.Continuation
    private var head: HTTPRequestHead?

    init(state: String, continuation: AsyncStream<LoopbackRedirect.Callback>.Continuation) {
        self.state = state
        self.continuation = continuation
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): self.head = head
        case .body: break
        case .end:
            guard let head else { return }
            self.head = nil
            let (status, page) = answer(head)
            respond(status, page, context: context)
        }
    }

    /// The page for `head`, after passing on the callback it carries, if it is the one awaited.
    private func answer(_ head: HTTPRequestHead) -> (HTTPResponseStatus, String) {
        let components = URLComponents(string: head.uri)
        guard head.method == .GET, let components, components.path == "/callback" else {
            return (.notFound, "Not found.")
        }
        var values: [String: String] = [:]
        for item in components.queryItems ?? [] where values[item.name] == nil {
            values[item.name] = item.value ?? ""
        }
        guard values["state"] == state else {
            return (.badRequest, "This sign-in response is not the one the broker is waiting for.")
        }
        if let error = values["error"] {
            continuation.yield(.error(String(error.utf8.prefix(LoopbackRedirect.maximumValue)) ?? "?"))
            continuation.finish()
            return (.ok, "The sign-in did not complete. You may close this tab.")
        }
        guard let code = values["code"], !code.isEmpty, code.utf8.count <= LoopbackRedirect.maximumValue else {
            return (.badRequest, "This sign-in response carries no usable code.")
        }
        continuation.yield(.code(code))
        continuation.finish()
        return (.ok, "Signed in. You may close this tab.")
    }

    private func respond(_ status: HTTPResponseStatus, _ text: String, context: ChannelHandlerContext) {
        let html = "<!doctype html><meta charset=utf-8><title>tokenbroker</title><p>\(text)</p>\n"
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/html; charset=utf-8")
        headers.add(name: "Content-Length", value: "\(html.utf8.count)")
        headers.add(name: "Connection", value: "close")
        headers.add(name: "Cache-Control", value: "no-store")
        headers.add(name: "Referrer-Policy", value: "no-referrer")
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))),
            promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: html)))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
    }
}
