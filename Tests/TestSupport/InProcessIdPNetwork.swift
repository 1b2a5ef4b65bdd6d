import Foundation
import NIOHTTP1
import Synchronization

/// Where a test IdP answers.
public enum TestIdPServing: Sendable {
    /// A real HTTP server on 127.0.0.1: for brokerd processes (the integration tests).
    case http
    /// In this process only, reached through `InProcessIdPTransport` (and `TestBrowser`): no
    /// socket is opened, so the engine's tests run the same whatever else the machine does.
    case inProcess

    /// Serves `handler` (a test IdP's behaviour) this way.
    func start(_ handler: @escaping @Sendable (TestHTTPRequest) -> TestHTTPResponse) async throws
        -> any TestIdPHost
    {
        switch self {
        case .http: return try await TestHTTPServer(handler: handler)
        case .inProcess: return InProcessIdPNetwork.Host(handler: handler)
        }
    }
}

/// A test IdP's endpoint, wherever it is served.
public protocol TestIdPHost: Sendable {
    /// `http://HOST:PORT`, without a trailing slash.
    var baseURL: String { get }
    /// Stops answering.
    func shutdown() async
}

/// The test IdPs served in this process, each at its own port of one loopback address on which
/// nothing listens: a request that went to the network by mistake is refused there, never
/// answered. Answers are delivered as `TestHTTPServer` delivers them, except that time is
/// simulated: an answer that hangs, or whose `delay` reaches the request's timeout, is a timeout
/// at once, without waiting it out, and a shorter `delay` is not waited at all (a test that
/// needs an answer held holds it with a gate, `holdAnswers`).
public enum InProcessIdPNetwork {
    /// What became of one request.
    public enum Outcome: Sendable {
        case answer(TestHTTPResponse)
        /// No IdP at that address.
        case refused
        /// The answer would have come after the timeout, or never.
        case timedOut
    }

    /// The address every in-process IdP shares (127.0.0.1 is where the broker's own login
    /// listener and the HTTP test IdPs are).
    static let host = "127.0.0.2"

    private static let handlers = Mutex<[Int: @Sendable (TestHTTPRequest) -> TestHTTPResponse]>([:])
    private static let lastPort = Atomic<Int>(10_000)

    /// An in-process IdP's registration.
    final class Host: TestIdPHost {
        let port: Int

        init(handler: @escaping @Sendable (TestHTTPRequest) -> TestHTTPResponse) {
            port = InProcessIdPNetwork.newPort()
            InProcessIdPNetwork.handlers.withLock { $0[port] = handler }
        }

        var baseURL: String { "http://\(InProcessIdPNetwork.host):\(port)" }

        func shutdown() async {
            _ = InProcessIdPNetwork.handlers.withLock { $0.removeValue(forKey: port) }
        }
    }

    private static func newPort() -> Int { lastPort.add(1, ordering: .relaxed).newValue }

    /// `http://HOST:PORT` of an address where no IdP answers (a request there is refused).
    public static func unusedBaseURL() -> String { "http://\(host):\(newPort())" }

    /// Whether `url` is served here rather than over the network.
    static func serves(_ url: URL) -> Bool { url.host == host }

    /// Hands a request for `url` to the IdP served there and delivers its answer within
    /// `timeout` seconds (simulated, see above).
    public static func exchange(
        method: HTTPMethod, url: URL, headers: HTTPHeaders, body: String, timeout: TimeInterval
    ) async -> Outcome {
        guard serves(url), let port = url.port, let handler = handlers.withLock({ $0[port] }),
            let components = URLComponents(url: url, resolvingAgainstBaseURL: false)
        else { return .refused }
        var headers = headers
        headers.replaceOrAdd(name: "Host", value: "\(host):\(port)")
        let answer = handler(
            TestHTTPRequest(
                method: method, path: components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath,
                query: components.percentEncodedQuery, headers: headers, body: body))
        if answer.hang || answer.delay >= .milliseconds(Int64(timeout * 1000)) { return .timedOut }
        if let gate = answer.gate {
            await withCheckedContinuation { (resumed: CheckedContinuation<Void, Never>) in
                gate.whenOpen { resumed.resume() }
            }
        }
        return .answer(answer)
    }
}
