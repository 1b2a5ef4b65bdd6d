import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The loopback listener of a browser login (RFC 8252 section 7.3): HTTP/1 on
/// `127.0.0.1:<port>`, answering only `GET /start` and `GET /callback`. `/start` with the key
/// sends the one browser that opens it to the IdP (`BrowserBinding`). A callback with the
/// wrong or no `state`, or without that browser's cookie, gets an error page and changes
/// nothing (anyone on the machine can reach the port); the first one with the right `state`
/// and the cookie ends the wait with its `code` or its `error`. A code's page waits for the
/// exchange (`finish`): it says "signed in" only when the broker got the tokens, else why not.
/// Any process on the machine may
/// connect, so connections are few (the oldest makes way for a new one), short-lived and small,
/// and all of them end with the listener.
package final class LoopbackRedirect: Sendable {
    /// What the browser brought back with the right `state`.
    package enum Callback: Sendable, Equatable {
        case code(String)
        case error(String)
    }

    /// Longest `code` or `error` taken from a callback, in bytes.
    package static let maximumValue = 4096
    /// Connections open at once; a new one beyond these closes the oldest.
    package static let maximumConnections = 16
    /// How long a connection may take to deliver its request before it is closed.
    package static let connectionLifetime = TimeAmount.seconds(10)
    /// Most bytes read from one connection (its request head and any body).
    package static let maximumRequestBytes = 16 * 1024
    /// Longest reason a page shows, in characters.
    package static let maximumReason = 1000

    package let port: Int
    private let binding: BrowserBinding
    private let channel: any Channel
    private let connections: LoopbackConnections
    /// The page of the callback that brought the code, answered by `finish`.
    private let codePage: CodePage
    /// Closes the listener at the login's deadline, should `close()` not come first.
    private let expiry: Task<Void, Never>
    private let callbacks: AsyncStream<Callback>

    /// The URI the IdP redirects the browser to.
    package var redirectURI: String { Self.redirectURI(port: port) }
    /// The one-time link the user's browser opens: it leads to the IdP.
    package var startURL: String { "http://127.0.0.1:\(port)/start?k=\(binding.key)" }

    private static func redirectURI(port: Int) -> String { "http://127.0.0.1:\(port)/callback" }

    /// Listens on `127.0.0.1:port` (`0`: a free port) for the callback carrying `state`, until
    /// `close()` or `deadline`, whichever comes first (a login held up, e.g. by a client that
    /// does not read its progress, does not keep the port open). `/start` sends the browser to
    /// `authorizationURL(redirectURI)`.
    package init(
        port: Int, state: String, until deadline: LoginDeadline,
        authorizationURL: (_ redirectURI: String) -> String
    ) async throws(BrokerFailure) {
        let (callbacks, continuation) = AsyncStream.makeStream(of: Callback.self, bufferingPolicy: .bufferingNewest(1))
        let connections = LoopbackConnections()
        let codePage = CodePage()
        let binding = BrowserBinding(until: deadline)
        let channel: any Channel
        do {
            channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.backlog, value: 16)
                .childChannelInitializer { child in
                    guard connections.admit(child) else {
                        return child.eventLoop.makeFailedFuture(ChannelError.ioOnClosedChannel)
                    }
                    return child.eventLoop.makeCompletedFuture {
                        try child.pipeline.syncOperations.addHandler(RequestSizeLimit())
                        try child.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                        try child.pipeline.syncOperations.addHandler(
                            CallbackHandler(
                                state: state, binding: binding, connections: connections, codePage: codePage,
                                continuation: continuation))
                    }
                }
                .bind(host: "127.0.0.1", port: port).get()
        } catch {
            continuation.finish()
            let errno = (error as? IOError)?.errnoCode
            throw .invalid(
                errno == EADDRINUSE
                    ? "port \(port) on 127.0.0.1 is in use; pick another --redirect-port or leave it out"
                    : "cannot listen on 127.0.0.1:\(port) for the redirect ("
                        + (errno.map { String(cString: strerror($0)) } ?? "\(error)")
                        + "); pick another --redirect-port or leave it out")
        }
        self.expiry = Task {
            guard await deadline.reached() else { return }
            channel.close(promise: nil)
            connections.closeAll()
        }
        self.channel = channel
        self.callbacks = callbacks
        self.connections = connections
        self.codePage = codePage
        self.binding = binding
        self.port = channel.localAddress?.port ?? port
        binding.arm(port: self.port, authorizationURL: authorizationURL(Self.redirectURI(port: self.port)))
    }

    /// The callback with the right `state`, or `nil` when `deadline` passed or the task was cancelled first.
    package func callback(until deadline: LoginDeadline) async -> Callback? {
        await withTaskGroup(of: Callback?.self) { group in
            group.addTask { [callbacks] in
                var iterator = callbacks.makeAsyncIterator()
                return await iterator.next()
            }
            group.addTask {
                _ = await deadline.reached()
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }

    /// Stops listening and closes every connection still open but the one awaiting `finish`:
    /// the port refuses connections from here on.
    package func close() async {
        expiry.cancel()
        try? await channel.close()
        connections.closeAll()
    }

    /// Answers the browser that brought the code with how its exchange went (`failure`'s
    /// `reason`, already cleaned of secrets, or success), then closes the listener and that
    /// connection. Without such a browser, only closes.
    package func finish(failure reason: String?) async {
        await close()
        let reply =
            reason.map { LoopbackReply(.badGateway, "The sign-in failed: \($0)") }
            ?? LoopbackReply(.ok, "Signed in. You may close this tab.")
        await codePage.answer(reply)
        connections.closeHeld()
    }
}

/// The page of the callback that brought the code: its connection waits for the answer
/// `LoopbackRedirect.finish` gives once the code was exchanged.
private final class CodePage: Sendable {
    /// The answer the waiting connection writes, and what completes once it was written; `taken`
    /// once a callback brought the code (later ones are told so).
    private let waiting = Mutex<(reply: EventLoopPromise<LoopbackReply>, written: EventLoopFuture<Void>)?>(nil)
    private let taken = Mutex(false)

    /// Claims the page for the first callback with the code; `false` when one already did.
    func claim() -> Bool {
        taken.withLock { taken in
            defer { taken = true }
            return !taken
        }
    }

    /// Makes the connection writing `reply`'s answer (done when `written` completes) wait.
    func wait(reply: EventLoopPromise<LoopbackReply>, written: EventLoopFuture<Void>) {
        waiting.withLock { $0 = (reply, written) }
    }

    /// Hands `reply` to the waiting connection and returns once it was written (or the
    /// connection closed); at once when none waits.
    func answer(_ reply: LoopbackReply) async {
        guard
            let waiting = waiting.withLock({ state in
                defer { state = nil }; return state
            })
        else { return }
        waiting.reply.succeed(reply)
        try? await waiting.written.get()
    }
}

/// The connections a listener accepted and has not closed yet, oldest first.
private final class LoopbackConnections: Sendable {
    private let open = Mutex<
        (
            channels: [ObjectIdentifier: (order: Int, channel: any Channel, expiry: Scheduled<Void>?)], next: Int,
            closed: Bool, held: (any Channel)?
        )
    >(
        ([:], 0, false, nil))

    /// Keeps `child` for at most `LoopbackRedirect.connectionLifetime`, closing the oldest
    /// connection when `child` is one too many; `false` when the listener is closed.
    func admit(_ child: any Channel) -> Bool {
        let key = ObjectIdentifier(child)
        let (admitted, evicted) = open.withLock { state -> (Bool, (any Channel)?) in
            if state.closed { return (false, nil) }
            var evicted: (any Channel)?
            if state.channels.count >= LoopbackRedirect.maximumConnections,
                let oldest = state.channels.min(by: { $0.value.order < $1.value.order })
            {
                evicted = state.channels.removeValue(forKey: oldest.key)?.channel
            }
            state.channels[key] = (state.next, child, nil)
            state.next += 1
            return (true, evicted)
        }
        evicted?.close(promise: nil)
        guard admitted else { return false }
        let expiry = child.eventLoop.scheduleTask(in: LoopbackRedirect.connectionLifetime) {
            child.close(promise: nil)
        }
        open.withLock { $0.channels[key]?.expiry = expiry }
        child.closeFuture.whenComplete { [self] _ in
            expiry.cancel()
            open.withLock { state in
                state.channels.removeValue(forKey: key)
                if let held = state.held, held === child { state.held = nil }
            }
        }
        return true
    }

    /// Keeps `child`, the connection that brought the code, open past its lifetime and beyond
    /// the reach of newer connections and `closeAll`, until `closeHeld`: its page waits for
    /// the exchange.
    func hold(_ child: any Channel) {
        let entry = open.withLock { state in
            defer { state.held = child }
            return state.channels.removeValue(forKey: ObjectIdentifier(child))
        }
        entry?.expiry?.cancel()
    }

    /// Closes the connection `hold` kept.
    func closeHeld() {
        open.withLock { state in
            defer { state.held = nil }
            return state.held
        }?.close(promise: nil)
    }

    /// Closes every connection but the held one, and any accepted from here on.
    func closeAll() {
        let channels = open.withLock { state in
            state.closed = true
            defer { state.channels = [:] }
            return state.channels.values.map(\.channel)
        }
        for channel in channels { channel.close(promise: nil) }
    }
}

/// Closes a connection that sends more than `LoopbackRedirect.maximumRequestBytes`: a callback
/// is one short GET.
private final class RequestSizeLimit: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private var received = 0

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        received += unwrapInboundIn(data).readableBytes
        guard received <= LoopbackRedirect.maximumRequestBytes else {
            context.close(promise: nil)
            return
        }
        context.fireChannelRead(data)
    }
}

/// Answers each request on one connection to the listener, and closes the connection after it.
private final class CallbackHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let state: String
    private let binding: BrowserBinding
    private let connections: LoopbackConnections
    private let codePage: CodePage
    private let continuation: AsyncStream<LoopbackRedirect.Callback>.Continuation
    private var head: HTTPRequestHead?

    init(
        state: String, binding: BrowserBinding, connections: LoopbackConnections, codePage: CodePage,
        continuation: AsyncStream<LoopbackRedirect.Callback>.Continuation
    ) {
        self.state = state
        self.binding = binding
        self.connections = connections
        self.codePage = codePage
        self.continuation = continuation
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): self.head = head
        case .body: break
        case .end:
            guard let head else { return }
            self.head = nil
            if let reply = answer(head, context: context) {
                respond(reply, context: context)
            }
        }
    }

    /// The answer to `head`, after passing on the callback it carries, if it is the one awaited;
    /// `nil` for the callback with the code, whose page waits for the exchange.
    private func answer(_ head: HTTPRequestHead, context: ChannelHandlerContext) -> LoopbackReply? {
        guard head.method == .GET, let components = URLComponents(string: head.uri),
            ["/start", "/callback"].contains(components.path)
        else {
            return .notFound
        }
        // RFC 6749 section 3.1: a parameter appears at most once; a repeated one makes the
        // request not the one awaited, whichever copy would have matched.
        var values: [String: String] = [:]
        var repeated = false
        for item in components.queryItems ?? [] {
            repeated = repeated || values[item.name] != nil
            values[item.name] = item.value ?? ""
        }
        let cookies = head.headers["Cookie"]
        if components.path == "/start" {
            return binding.start(key: repeated ? nil : values["k"], cookies: cookies)
        }
        guard !repeated, values["state"] == state else {
            return LoopbackReply(.badRequest, "This sign-in response is not the one the broker is waiting for.")
        }
        guard binding.isFromTheStartingBrowser(cookies: cookies) else {
            return LoopbackReply(
                .forbidden,
                "This sign-in response did not come from the browser that started the sign-in; finish it there.")
        }
        let error = values["error"]
        let code = values["code"].flatMap { $0.isEmpty || $0.utf8.count > LoopbackRedirect.maximumValue ? nil : $0 }
        guard error != nil || code != nil else {
            return LoopbackReply(.badRequest, "This sign-in response carries no usable code.")
        }
        guard codePage.claim() else {
            return LoopbackReply(
                .conflict, "This sign-in already received its answer; the first page shows how it went.")
        }
        if let error {
            let text = String(error.utf8.prefix(LoopbackRedirect.maximumValue)) ?? "?"
            continuation.yield(.error(text))
            continuation.finish()
            let reason = OutsideText(secrets: []).clean(text, or: "no reason given")
            return LoopbackReply(
                .forbidden, "The sign-in failed: the IdP answered \(reason). Run brokerctl login to try again.")
        }
        // The page is written once `finish` gives it; the connection closes after it (or
        // before, when the browser goes away), which is what `finish` waits for.
        let reply = context.eventLoop.makePromise(of: LoopbackReply.self)
        codePage.wait(reply: reply, written: context.channel.closeFuture)
        connections.hold(context.channel)
        reply.futureResult.assumeIsolated().whenSuccess { [self] reply in respond(reply, context: context) }
        context.channel.closeFuture.whenComplete { _ in reply.fail(ChannelError.ioOnClosedChannel) }
        continuation.yield(.code(code ?? ""))
        continuation.finish()
        return nil
    }

    /// Writes `reply` and closes the connection.
    private func respond(_ reply: LoopbackReply, context: ChannelHandlerContext) {
        let html =
            "<!doctype html><meta charset=utf-8><title>tokenbroker</title><p>\(HTMLText.escaped(reply.text))</p>\n"
        var headers = HTTPHeaders(reply.headers)
        headers.add(name: "Content-Type", value: "text/html; charset=utf-8")
        headers.add(name: "Content-Length", value: "\(html.utf8.count)")
        headers.add(name: "Connection", value: "close")
        headers.add(name: "Cache-Control", value: "no-store")
        headers.add(name: "Referrer-Policy", value: "no-referrer")
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: reply.status, headers: headers))),
            promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: html)))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in channel.close(promise: nil) }
    }

}

/// One answer of the loopback listener: a status, a short page, and headers of its own (a
/// redirect's `Location`, a `Set-Cookie`).
package struct LoopbackReply {
    package var status: HTTPResponseStatus
    package var text: String
    package var headers: [(String, String)]

    package init(_ status: HTTPResponseStatus, _ text: String, headers: [(String, String)] = []) {
        self.status = status
        self.text = text
        self.headers = headers
    }

    package static let notFound = LoopbackReply(.notFound, "Not found.")
}
