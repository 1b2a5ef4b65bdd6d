import Synchronization

/// An IdP (on 127.0.0.1 or in process, `TestIdPServing`) that answers every request with the one response the test gave it (any
/// status, headers and body, hostile ones included), and counts its calls.
public final class ScriptedIdP: Sendable {
    private final class Counter: Sendable {
        let calls = Mutex(0)
    }

    private let counter: Counter
    private let server: any TestIdPHost

    public init(_ response: TestHTTPResponse, serving: TestIdPServing = .http) async throws {
        let counter = Counter()
        self.counter = counter
        server = try await serving.start { _ in
            counter.calls.withLock { $0 += 1 }
            return response
        }
    }

    /// A token endpoint (every path is answered alike).
    public var url: String { server.baseURL + "/token" }
    public var baseURL: String { server.baseURL }
    public var callCount: Int { counter.calls.withLock { $0 } }

    public func shutdown() async { await server.shutdown() }
}
