import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// A real OAuth2 token endpoint on 127.0.0.1 for tests. It behaves like production IdPs:
/// every refresh rotates the refresh token, and a reused (or unknown) refresh token is
/// answered with `400 invalid_grant`. Faults can be switched on to imitate outages.
public final class OAuth2TestIdP: Sendable {
    /// How the endpoint answers the next requests.
    public enum Behavior: Sendable, Equatable {
        case normal
        /// Answer with this HTTP status and a JSON error body (and `Retry-After` if given).
        case status(Int, retryAfter: Int?)
        /// Answer 200 with a body that is not JSON.
        case garbage
        /// Accept the request and never answer.
        case hang
    }

    /// One request the endpoint received.
    public struct Call: Sendable, Equatable {
        public var refreshToken: String?
        public var clientID: String?
        public var clientSecret: String?
        public var at: Date
    }

    fileprivate struct State {
        var currentRefreshToken: String
        var serial = 0
        var issuedAccessTokens: [String] = []
        var issuedRefreshTokens: [String] = []
        var calls: [Call] = []
        var rejectedReuse = 0
        var behavior = Behavior.normal
        var lifetime: Int
        var delay: Duration = .zero
    }

    public let clientID: String
    public let clientSecret: String
    private let state: Box<State>
    private let channel: any Channel

    /// The token endpoint's URL.
    public var tokenEndpoint: String {
        "http://127.0.0.1:\(channel.localAddress!.port!)/token"
    }

    /// Starts the server; `initialRefreshToken` is the one valid refresh token at first.
    public init(
        initialRefreshToken: String = "rt-0", lifetime: Int = 3600, clientID: String = "test-client",
        clientSecret: String = "test-client-secret-\(UInt32.random(in: 0...UInt32.max))"
    ) async throws {
        self.clientID = clientID
        self.clientSecret = clientSecret
        let state = Box(State(currentRefreshToken: initialRefreshToken, lifetime: lifetime))
        self.state = state
        let secret = clientSecret
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(
                        TokenEndpointHandler(state: state, clientID: clientID, clientSecret: secret))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    /// Stops listening.
    public func shutdown() async {
        try? await channel.close()
    }

    // MARK: Controls and observations

    public func setBehavior(_ behavior: Behavior) { state.withLock { $0.behavior = behavior } }
    public func setLifetime(_ seconds: Int) { state.withLock { $0.lifetime = seconds } }
    public func setDelay(_ delay: Duration) { state.withLock { $0.delay = delay } }

    public var calls: [Call] { state.withLock { $0.calls } }
    public var callCount: Int { state.withLock { $0.calls.count } }
    public var issuedAccessTokens: [String] { state.withLock { $0.issuedAccessTokens } }
    public var issuedRefreshTokens: [String] { state.withLock { $0.issuedRefreshTokens } }
    /// How many requests presented a refresh token that was not the current one.
    public var rejectedReuse: Int { state.withLock { $0.rejectedReuse } }

    fileprivate struct Answer {
        var status: HTTPResponseStatus
        var body: String
        var headers: [(String, String)] = []
        var delay: Duration = .zero
        var hang = false
    }

    fileprivate static func answer(_ form: [String: String], authorization: String?, state: Box<State>, clientID: String, clientSecret: String) -> Answer {
        var presentedID = form["client_id"]
        var presentedSecret = form["client_secret"]
        if let authorization, authorization.hasPrefix("Basic "),
            let decoded = Data(base64Encoded: String(authorization.dropFirst(6))).map({ String(decoding: $0, as: UTF8.self) }),
            let colon = decoded.firstIndex(of: ":")
        {
            presentedID = String(decoded[..<colon]).removingPercentEncoding
            presentedSecret = String(decoded[decoded.index(after: colon)...]).removingPercentEncoding
        }
        return state.withLock { state in
            state.calls.append(
                Call(refreshToken: form["refresh_token"], clientID: presentedID, clientSecret: presentedSecret, at: Date()))
            let delay = state.delay
            switch state.behavior {
            case .hang:
                return Answer(status: .ok, body: "", hang: true)
            case .garbage:
                return Answer(status: .ok, body: "<html>this is not json", delay: delay)
            case .status(let code, let retryAfter):
                return Answer(
                    status: HTTPResponseStatus(statusCode: code), body: #"{"error":"temporarily_unavailable"}"#,
                    headers: retryAfter.map { [("Retry-After", String($0))] } ?? [], delay: delay)
            case .normal:
                break
            }
            guard form["grant_type"] == "refresh_token" else {
                return Answer(status: .badRequest, body: #"{"error":"unsupported_grant_type"}"#, delay: delay)
            }
            guard presentedID == clientID, presentedSecret == nil || presentedSecret == clientSecret else {
                return Answer(status: .unauthorized, body: #"{"error":"invalid_client"}"#, delay: delay)
            }
            guard form["refresh_token"] == state.currentRefreshToken else {
                state.rejectedReuse += 1
                return Answer(status: .badRequest, body: #"{"error":"invalid_grant","error_description":"refresh token is not valid"}"#, delay: delay)
            }
            state.serial += 1
            let access = "at-\(state.serial)-\(UInt32.random(in: 0...UInt32.max))"
            let refresh = "rt-\(state.serial)-\(UInt32.random(in: 0...UInt32.max))"
            state.currentRefreshToken = refresh
            state.issuedAccessTokens.append(access)
            state.issuedRefreshTokens.append(refresh)
            let body = #"{"access_token":"\#(access)","token_type":"Bearer","expires_in":\#(state.lifetime),"refresh_token":"\#(refresh)"}"#
            return Answer(status: .ok, body: body, delay: delay)
        }
    }
}

/// Parses one HTTP request at a time and answers it as the token endpoint.
private final class TokenEndpointHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let state: Box<OAuth2TestIdP.State>
    private let clientID: String
    private let clientSecret: String
    private var head: HTTPRequestHead?
    private var body = ByteBuffer()

    init(state: Box<OAuth2TestIdP.State>, clientID: String, clientSecret: String) {
        self.state = state
        self.clientID = clientID
        self.clientSecret = clientSecret
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
            let form = FormBody.parse(String(buffer: body))
            let answer = OAuth2TestIdP.answer(
                form, authorization: head.headers.first(name: "Authorization"), state: state, clientID: clientID,
                clientSecret: clientSecret)
            if answer.hang { return }
            let channel = context.channel
            let respond: @Sendable () -> Void = {
                var headers = HTTPHeaders([("Content-Type", "application/json"), ("Content-Length", "\(answer.body.utf8.count)")])
                for (name, value) in answer.headers { headers.add(name: name, value: value) }
                channel.write(HTTPServerResponsePart.head(HTTPResponseHead(version: .http1_1, status: answer.status, headers: headers)), promise: nil)
                channel.write(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(string: answer.body))), promise: nil)
                channel.writeAndFlush(HTTPServerResponsePart.end(nil), promise: nil)
            }
            if answer.delay == .zero {
                respond()
            } else {
                let nanoseconds = answer.delay.components.seconds * 1_000_000_000 + answer.delay.components.attoseconds / 1_000_000_000
                context.eventLoop.scheduleTask(in: .nanoseconds(nanoseconds)) { respond() }
            }
        }
    }
}

/// `application/x-www-form-urlencoded` parsing for the test IdP.
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
}

/// A mutex-protected value that can be shared by reference (a `Mutex` itself cannot be copied).
final class Box<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>

    init(_ value: Value) { mutex = Mutex(value) }

    func withLock<T>(_ body: (inout sending Value) throws -> sending T) rethrows -> T {
        try mutex.withLock(body)
    }
}
