import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// Requests to brokerd on the calling thread, each on a short connection of its own: connect,
/// check who serves the socket (`SO_PEERCRED`), write the request line, wait for its answer
/// line, close. Nothing else is started (no thread, no task), so a program that needs one
/// token pays for nothing more; `brokerctl` is one. Programs that ask often, from many tasks,
/// use `BrokerClient` and its shared connection.
public struct BlockingBrokerClient: Sendable {
    /// The broker's socket.
    public var socketPath: String
    /// Longest wait for an answer (a token request may wait for a refresh at the IdP);
    /// `nil` waits as long as the broker takes.
    public var timeout: Duration?

    public init(socketPath: String = DefaultPaths().socket, timeout: Duration? = .seconds(120)) {
        self.socketPath = socketPath
        self.timeout = timeout
    }

    /// Sends `call` and returns its result; a failure answer is thrown as its `BrokerError`.
    public func perform<Result>(_ call: BrokerCall<Result>) throws -> Result {
        let fd = try BrokerSocket.connect(socketPath)
        defer { close(fd) }
        var reader = LineReader(descriptor: fd)
        return try BrokerCall.result(of: exchange(fd, try call.line(id: Self.requestID), reader: &reader).line)
    }

    /// The access token of `account`, valid for at least `minTTL` seconds (for `scope` and
    /// `resource`, when given): `perform(.token(…))` without the decoder when the answer has
    /// the usual shape (`FlatTokenAnswer`).
    public func accessToken(
        account: String, minTTL: TimeInterval? = nil, scope: String? = nil, resource: String? = nil
    ) throws -> String {
        let fd = try BrokerSocket.connect(socketPath)
        defer { close(fd) }
        var reader = LineReader(descriptor: fd)
        // The usual request is written without building a `Request`, whose copies and
        // destruction instantiate the metadata of all its fields' types at run time.
        let line =
            if scope == nil, resource == nil,
                let flat = FlatRequest.line(op: "token", account: account, minTTL: minTTL, id: Self.requestID)
            {
                Data(flat)
            } else {
                try BrokerCall.token(account: account, minTTL: minTTL, scope: scope, resource: resource)
                    .line(id: Self.requestID)
            }
        let answer = try exchange(fd, line, reader: &reader)
        return try answer.accessToken ?? BrokerCall<TokenResult>.result(of: answer.line).accessToken
    }

    /// Subscribes to the events of `accounts` (all when `nil`), runs `subscribed` once the
    /// broker accepted (events from then on are not missed: a caller reads the current state
    /// there), and hands each event to `body`, until the broker ends the subscription (thrown
    /// as its `BrokerError`), the connection breaks (`ConnectionError`) or a closure throws.
    public func watch(
        accounts: [String]? = nil, subscribed: () throws -> Void = {}, _ body: (BrokerEvent) throws -> Void
    ) throws -> Never {
        let fd = try BrokerSocket.connect(socketPath)
        defer { close(fd) }
        var reader = LineReader(descriptor: fd)
        let line = try BrokerCall.subscribe(accounts: accounts).line(id: Self.requestID)
        _ = try BrokerCall<SubscribeResult>.result(of: exchange(fd, line, reader: &reader).line)
        try subscribed()
        let decoder = Wire.makeDecoder()
        while let line = try reader.next() {
            let head = try? decoder.decode(ResponseHead.self, from: line)
            if head?.event != nil, let event = try? decoder.decode(BrokerEvent.self, from: line) {
                try body(event)
            } else if let error = head?.error {
                // A final failure line (e.g. `busy` for a reader too slow) ends the subscription.
                throw error.brokerError
            }
        }
        throw ConnectionError(description: "the broker closed the connection")
    }

    /// Sends `call`, which the broker answers with progress lines before its final line (as it
    /// answers `login`), hands each progress line to `progress`, and returns the final line's
    /// result (a failure line is thrown as its `BrokerError`).
    ///
    /// No read timeout applies (`timeout` is not used): the operation bounds itself (a login
    /// ends at its own timeout) and progress lines may be minutes apart. `idle` runs every
    /// `idleInterval` until the final line, whether progress lines come or not; it bounds the
    /// wait, or stops it on Ctrl-C, by throwing. The connection is closed on every exit, which
    /// cancels an unfinished operation.
    public func perform<Result>(
        _ call: BrokerCall<Result>, idleInterval: Duration = .milliseconds(250), idle: () throws -> Void = {},
        progress: (Data) throws -> Void
    ) throws -> Result {
        let fd = try BrokerSocket.connect(socketPath)
        defer { close(fd) }
        var reader = LineReader(descriptor: fd)
        let id = Self.requestID
        if !BrokerSocket.send(fd, try call.line(id: id)) { shutdown(fd, Int32(SHUT_WR)) }
        let decoder = Wire.makeDecoder()
        var nextIdle = ContinuousClock.now + idleInterval
        while true {
            switch try reader.read(until: nextIdle) {
            case .timedOut:
                try idle()
                nextIdle = ContinuousClock.now + idleInterval
            case .end:
                throw ConnectionError(description: "the broker closed the connection")
            case .line(let line):
                guard let head = try? decoder.decode(ResponseHead.self, from: line) else { continue }
                if head.id == id, head.ok != nil { return try BrokerCall.result(of: line) }
                if head.id == id, head.event != nil { try progress(line) }
                // An error about the connection itself (e.g. forbidden) answers this request too.
                if head.id == nil || head.id == .null, let error = head.error { throw error.brokerError }
            }
        }
    }

    /// The id of every request: one request per connection.
    private static var requestID: RequestID { .integer(1) }

    /// Writes `line` (a request with `requestID`) and reads lines until the answer to it (at
    /// most `timeout`): the line, and its access token when it is a token answer in the usual
    /// shape (`FlatTokenAnswer`, read without the decoder).
    private func exchange(_ fd: Int32, _ line: Data, reader: inout LineReader) throws -> (
        line: Data, accessToken: String?
    ) {
        let deadline = timeout.map { ContinuousClock.now + $0 }
        let id = Self.requestID
        // A failed send means the broker went away; what it said before closing (e.g.
        // forbidden) is still read below.
        if !BrokerSocket.send(fd, line) { shutdown(fd, Int32(SHUT_WR)) }
        // Made only for a line of another shape: the usual token answer needs no decoder.
        lazy var decoder = Wire.makeDecoder()
        while let line = try reader.next(deadline: deadline) {
            if let answer = line.withUnsafeBytes(FlatTokenAnswer.parse), case .integer(answer.id) = id {
                return (line, answer.accessToken)
            }
            guard let head = try? decoder.decode(ResponseHead.self, from: line) else { continue }
            if head.id == id, head.event == nil { return (line, nil) }
            // An error about the connection itself (e.g. forbidden) answers this request too.
            if head.id == nil || head.id == .null, let error = head.error { throw error.brokerError }
        }
        throw ConnectionError(description: "the broker closed the connection")
    }
}
