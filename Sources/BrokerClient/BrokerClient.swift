import BrokerProtocol
import FoundationEssentials
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Thrown by a `withToken` body when the resource server refused the token (e.g. HTTP 401).
public struct TokenRefused: Error, Sendable {
    public init() {}
}

/// A connection to brokerd: one persistent Unix socket with pipelining, so any number of
/// tasks may share it and ask concurrently; a reader thread of its own delivers the answers
/// and events (so no task blocks while the broker refreshes). Uses only the protocol module and
/// the toolchain. For a single request, `BlockingBrokerClient` starts no thread at all.
///
/// The broker closes connections that stay idle for minutes; a call made after that connects
/// again, so a long-lived program needs no reconnect logic of its own. (A call that crosses the
/// close itself still fails with `ConnectionError`; it is not sent twice.)
public final class BrokerClient: Sendable {
    private let socketPath: String
    /// The current connection, and whether `close()` was called (then nothing reconnects).
    private let state: Mutex<(connection: Connection, closed: Bool)>

    /// Connects to the broker's socket (default: `DefaultPaths().socket`).
    public init(socketPath: String = DefaultPaths().socket) throws {
        self.socketPath = socketPath
        state = Mutex((try Connection(socketPath: socketPath), false))
    }

    deinit { state.withLock { $0.connection.close() } }

    /// Closes the connection; pending and later calls fail with `ConnectionError`.
    public func close() {
        state.withLock { state in
            state.closed = true
            state.connection.close()
        }
    }

    /// The connection to send on: a new one when the broker closed the last (e.g. for idleness)
    /// before this call, unless `close()` was called.
    private func liveConnection() throws -> Connection {
        let (current, reconnect) = state.withLock { ($0.connection, $0.connection.hasEnded && !$0.closed) }
        guard reconnect else { return current }
        // Connected outside the lock, so a slow connect holds up no other caller.
        let fresh = try Connection(socketPath: socketPath)
        return state.withLock { state in
            guard state.connection === current, !state.closed else {
                fresh.close()
                return state.connection
            }
            state.connection = fresh
            return fresh
        }
    }

    // MARK: Operations

    /// An access token valid for at least `minTTL` seconds (the broker refreshes if needed),
    /// narrowed to `scope` (space-separated) and bound to `resource` (an absolute URI, RFC 8707)
    /// when given; the result's `scope` is what the IdP granted.
    public func token(
        account: String, minTTL: TimeInterval? = nil, scope: String? = nil, resource: String? = nil
    ) async throws -> TokenResult {
        try await perform(.token(account: account, minTTL: minTTL, scope: scope, resource: resource))
    }

    /// The two headers of a request to `url` with `method` under a DPoP-bound token of
    /// `account` (RFC 9449 section 7.1): `Authorization: DPoP <token>` and `DPoP: <proof>`,
    /// the proof made by the broker for that one request (with the resource server's `nonce`
    /// when it asked for one). An account of bearer tokens is `bad_request`.
    public func dpopHeaders(
        account: String, method: String, url: String, nonce: String? = nil, minTTL: TimeInterval? = nil
    ) async throws -> DPoPHeaders {
        try DPoPHeaders(
            await perform(
                .token(account: account, minTTL: minTTL, dpop: DPoPRequest(htm: method, htu: url, nonce: nonce)))
        )
    }

    /// Reports that a resource server refused `accessToken` (got with `scope` and `resource`);
    /// returns the token to use instead.
    public func reject(
        account: String, accessToken: String, minTTL: TimeInterval? = nil, scope: String? = nil,
        resource: String? = nil
    ) async throws -> TokenResult {
        try await perform(
            .reject(account: account, accessToken: accessToken, minTTL: minTTL, scope: scope, resource: resource))
    }

    /// Runs `body` with a token (for `scope` and `resource`, when given); if `body` throws
    /// `TokenRefused`, rejects the token and runs `body` exactly once more with the
    /// replacement. A second refusal is rethrown.
    public func withToken<T>(
        account: String, minTTL: TimeInterval? = nil, scope: String? = nil, resource: String? = nil,
        _ body: (TokenResult) async throws -> T
    ) async throws -> T {
        let token = try await self.token(account: account, minTTL: minTTL, scope: scope, resource: resource)
        do {
            return try await body(token)
        } catch is TokenRefused {
            let replacement = try await reject(
                account: account, accessToken: token.accessToken, minTTL: minTTL, scope: scope, resource: resource)
            return try await body(replacement)
        }
    }

    /// The broker's protocol version, name and operations.
    public func hello(client: String? = nil) async throws -> HelloResult {
        try await perform(.hello(client: client))
    }

    /// The state of one account, or of all visible accounts.
    public func status(account: String? = nil) async throws -> [AccountStatus] {
        try await perform(.status(account: account)).accounts
    }

    /// Creates an account (owner only).
    public func add(account: String, provider: ProviderSpec, tokens: TokenSet? = nil) async throws -> AccountResult {
        try await perform(.add(account: account, provider: provider, tokens: tokens))
    }

    /// Pushes new tokens into an account (owner only); clears `needs_login`.
    public func setTokens(account: String, tokens: TokenSet) async throws -> AccountResult {
        try await perform(.setTokens(account: account, tokens: tokens))
    }

    /// Deletes an account and its secrets (owner only).
    public func remove(account: String) async throws -> AccountResult {
        try await perform(.remove(account: account))
    }

    /// Revokes an account's credential where the IdP can, then discards its tokens (owner
    /// only); `force` discards them even when the IdP cannot be reached.
    public func logout(account: String, force: Bool = false) async throws -> LogoutResult {
        try await perform(.logout(account: account, force: force))
    }

    /// Makes the broker re-read its config file (owner only).
    public func reload() async throws -> ReloadResult {
        try await perform(.reload())
    }

    /// Refreshes an account now (owner only).
    public func refresh(account: String) async throws -> AccountResult {
        try await perform(.refresh(account: account))
    }

    /// Events of `accounts` (all when `nil`) as they happen. The stream ends with an error if
    /// the connection breaks or the broker drops this subscriber for reading too slowly.
    public func events(accounts: [String]? = nil) async throws -> AsyncThrowingStream<BrokerEvent, any Error> {
        let (stream, continuation) = AsyncThrowingStream<BrokerEvent, any Error>.makeStream()
        _ = try await perform(.subscribe(accounts: accounts), subscription: continuation)
        return stream
    }

    /// Sends `call` and returns its result; a failure line becomes a thrown `BrokerError`.
    public func perform<Result>(_ call: BrokerCall<Result>) async throws -> Result {
        try await perform(call, subscription: nil)
    }

    private func perform<Result>(
        _ call: BrokerCall<Result>, subscription: AsyncThrowingStream<BrokerEvent, any Error>.Continuation?
    ) async throws -> Result {
        let line = try await liveConnection().exchange(subscription: subscription) { try call.line(id: $0) }
        return try BrokerCall<Result>.result(of: line)
    }
}

/// The socket and its reader thread; the thread keeps this alive until the socket closes.
private final class Connection: Sendable {
    private struct State {
        var nextID: Int64 = 1
        var pending: [RequestID: CheckedContinuation<Data, any Error>] = [:]
        var subscriptions: [RequestID: AsyncThrowingStream<BrokerEvent, any Error>.Continuation] = [:]
        var failure: (any Error)?
        /// Set once the reader has closed the descriptor; its number may then belong to another socket.
        var descriptorClosed = false
    }

    private let descriptor: Int32
    private let state = Mutex(State())
    private let writeLock = Mutex(())

    init(socketPath: String) throws {
        descriptor = try BrokerSocket.connect(socketPath)
        try startReaderThread()
    }

    /// Whether the connection has broken or was closed (no request can succeed on it any more).
    var hasEnded: Bool { state.withLock { $0.failure != nil } }

    /// Shuts the socket down; the reader thread then sees end of stream and closes it.
    func close() {
        state.withLock { state in
            if !state.descriptorClosed { _ = shutdown(descriptor, Int32(SHUT_RDWR)) }
        }
    }

    func exchange(
        subscription: AsyncThrowingStream<BrokerEvent, any Error>.Continuation? = nil,
        _ encode: (RequestID) throws -> Data
    ) async throws -> Data {
        let id: RequestID = state.withLock { state in
            defer { state.nextID += 1 }
            return .integer(state.nextID)
        }
        let data = try encode(id)
        return try await withCheckedThrowingContinuation { continuation in
            let failure: (any Error)? = state.withLock { state in
                if let failure = state.failure { return failure }
                state.pending[id] = continuation
                if let subscription { state.subscriptions[id] = subscription }
                return nil
            }
            if let failure { return continuation.resume(throwing: failure) }
            let sent = writeLock.withLock { _ in BrokerSocket.send(descriptor, data) }
            // A failed send means the broker went away; the reader still delivers whatever the
            // broker said before closing (e.g. forbidden), then fails every pending request.
            if !sent { shutdown(descriptor, Int32(SHUT_WR)) }
        }
    }

    /// Runs `readLoop` on a thread of its own (`OwnThread`); on failure the socket is closed.
    private func startReaderThread() throws {
        let result = OwnThread.start { self.readLoop() }
        guard result == 0 else {
            Glibc.close(descriptor)
            throw ConnectionError(description: "cannot start the reader thread: \(String(cString: strerror(result)))")
        }
    }

    private func readLoop() {
        var reader = LineReader(descriptor: descriptor)
        var ending = ConnectionError(description: "the broker closed the connection")
        do {
            while let line = try reader.next() { deliver(line) }
        } catch {
            ending = error
        }
        fail(ending)
        state.withLock { state in
            state.descriptorClosed = true
            _ = Glibc.close(descriptor)
        }
    }

    private func deliver(_ line: Data) {
        guard let head = try? Wire.makeDecoder().decode(ResponseHead.self, from: line) else { return }
        guard let id = head.id, id != .null else {
            // An error about the connection itself (e.g. forbidden): it applies to every request.
            if let error = head.error { fail(error.brokerError) }
            return
        }
        if head.event != nil {
            let subscription = state.withLock { $0.subscriptions[id] }
            if let event = try? Wire.makeDecoder().decode(BrokerEvent.self, from: line) { subscription?.yield(event) }
            return
        }
        // A failure line for a subscription's id (its refusal, or a final `busy`) ends it.
        let (continuation, subscription) = state.withLock { state in
            (
                state.pending.removeValue(forKey: id),
                head.ok == false ? state.subscriptions.removeValue(forKey: id) : nil
            )
        }
        continuation?.resume(returning: line)
        subscription?.finish(throwing: head.error?.brokerError ?? BrokerError(.internal, "subscription ended"))
    }

    private func fail(_ error: any Error) {
        let (pending, subscriptions) = state.withLock { state in
            if state.failure == nil { state.failure = error }
            defer {
                state.pending = [:]
                state.subscriptions = [:]
            }
            return (Array(state.pending.values), Array(state.subscriptions.values))
        }
        for continuation in pending { continuation.resume(throwing: error) }
        for subscription in subscriptions { subscription.finish(throwing: error) }
    }
}
