import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// Hostile or broken input on the socket gets the right error or a closed connection, and a
/// well-behaved client on another connection is served throughout.
@Suite struct BadInputTests {
    @Test func badLinesGetErrorsAndOthersAreServedThroughout() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let good = try broker.client()
        defer { good.close() }
        _ = try await good.add(
            account: "steady", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "steady-token", expiresIn: 3600))

        // A well-behaved client keeps asking on its own connection the whole time, on its own
        // thread so the blocking reads of this test cannot starve it.
        let steady = try SteadyClient(path: broker.socketPath, account: "steady")

        let idle = try (0..<500).map { _ in try RawConnection(path: broker.socketPath) }

        let raw = try RawConnection(path: broker.socketPath)
        let cases: [(line: String, code: String, id: Any?)] = [
            ("this is not json", "bad_request", nil),
            ("[1,2,3]", "bad_request", nil),
            (#"{"id":41}"#, "bad_request", 41),
            (#"{"id":"x","op":"fly"}"#, "unknown_op", "x"),
            (#"{"id":43,"op":"token"}"#, "bad_request", 43),
            (#"{"id":44,"op":"token","account":"ghost"}"#, "not_found", 44),
            (#"{"id":45,"op":"token","account":"steady","min_ttl":"soon"}"#, "bad_request", 45),
            (#"{"id":46,"op":"hello","versions":[7]}"#, "unsupported_version", 46),
        ]
        for testCase in cases {
            raw.send(testCase.line + "\n")
            let answer = try #require(raw.readObject(), "no answer to \(testCase.line)")
            #expect(answer["ok"] as? Bool == false)
            #expect(answer.errorCode == testCase.code, "\(testCase.line)")
            if let id = testCase.id as? Int { #expect(answer["id"] as? Int == id) }
            if let id = testCase.id as? String { #expect(answer["id"] as? String == id) }
            if testCase.id == nil { #expect(answer["id"] is NSNull) }
        }

        // Random bytes (no newline inside), then a newline: one bad_request, connection still usable.
        var noise = (0..<4096).map { _ in UInt8.random(in: 0...255) }
        noise.removeAll { $0 == 0x0A }
        raw.send(noise + [0x0A])
        #expect(raw.readObject()?.errorCode == "bad_request")
        raw.send(#"{"id":47,"op":"token","account":"steady"}"# + "\n")
        #expect(raw.readObject()?["ok"] as? Bool == true)

        // A 1 MiB line: line_too_long, then the broker closes the connection.
        let huge = try RawConnection(path: broker.socketPath)
        huge.send([UInt8](repeating: UInt8(ascii: "a"), count: 1 << 20) + [0x0A])
        #expect(huge.readObject()?.errorCode == "line_too_long")
        #expect(huge.isClosedByPeer())

        // Half a line, then a disconnect: nothing breaks.
        do {
            let half = try RawConnection(path: broker.socketPath)
            half.send(#"{"id":48,"op":"tok"#)
        }

        let (answers, failures) = steady.stop()
        #expect(answers > 0)
        #expect(failures == 0)
        // The idle connections are all still open and served.
        for connection in idle.prefix(5) {
            connection.send(#"{"id":1,"op":"token","account":"steady"}"# + "\n")
            #expect(connection.readObject()?["ok"] as? Bool == true)
        }
        #expect(try await good.token(account: "steady").accessToken == "steady-token")
    }
}

/// Asks for a token in a loop on a dedicated thread and counts good and bad answers.
final class SteadyClient: @unchecked Sendable {
    private let connection: RawConnection
    private let lock = NSLock()
    private var running = true
    private var answers = 0
    private var failures = 0
    private let done = DispatchSemaphore(value: 0)

    init(path: String, account: String) throws {
        connection = try RawConnection(path: path)
        Thread { [self] in
            while lock.withLock({ running }) {
                connection.send(#"{"id":1,"op":"token","account":"\#(account)"}"# + "\n")
                let good = connection.readObject()?["ok"] as? Bool == true
                lock.withLock { if good { answers += 1 } else { failures += 1 } }
            }
            done.signal()
        }.start()
    }

    /// Stops the loop; returns (good answers, failed answers).
    func stop() -> (Int, Int) {
        lock.withLock { running = false }
        done.wait()
        return lock.withLock { (answers, failures) }
    }
}
