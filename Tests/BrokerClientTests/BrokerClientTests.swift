import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// Both clients against a scripted stand-in broker: `BrokerClient`, pipelined on one shared
/// connection, and `BlockingBrokerClient`, one request per connection on the calling thread.
@Suite struct BrokerClientTests {
    /// The two clients, for what holds for both.
    enum Client: CaseIterable, Sendable {
        /// `BrokerClient`; `BlockingBrokerClient.perform`; `BlockingBrokerClient.accessToken`,
        /// which reads the usual answer without the decoder.
        case pipelined, blocking, blockingAccessToken

        /// Asks `broker` for the access token of `account` with this client, on a connection of its own.
        func accessToken(_ account: String, from broker: FakeBroker) async throws -> String {
            let blocking = BlockingBrokerClient(socketPath: broker.socketPath, timeout: .seconds(60))
            switch self {
            case .pipelined:
                let client = try BrokerClient(socketPath: broker.socketPath)
                defer { client.close() }
                return try await client.token(account: account).accessToken
            case .blocking:
                return try blocking.perform(.token(account: account)).accessToken
            case .blockingAccessToken:
                return try blocking.accessToken(account: account)
            }
        }
    }

    // MARK: Both clients

    @Test(arguments: Client.allCases)
    func linesForOtherIDsAreSkippedAndAnAnswerInPiecesIsReadWhole(client: Client) async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            let request = try peer.request()
            peer.write(Peer.answer(.integer(999), result: Peer.token(account: "a", accessToken: "at-stray")))
            peer.write(Peer.answer(.string("1"), result: Peer.token(account: "a", accessToken: "at-string-id")))
            peer.write(#"{"id":null,"ok":true,"event":"refreshed","account":"a"}"# + "\n")
            let answer = Peer.answer(request.id, result: Peer.token(account: "a", accessToken: "at-right"))
            for piece in [answer.prefix(5), answer.dropFirst(5).prefix(20), answer.dropFirst(25)] {
                peer.write(String(piece))
                peer.pause(milliseconds: 20)
            }
        }
        #expect(try await client.accessToken("a", from: broker) == "at-right")
        try await serving.value
    }

    @Test(arguments: Client.allCases)
    func aFailureAnswerIsThrownAsItsBrokerError(client: Client) async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            let request = try peer.request()
            peer.write(Peer.failure(request.id, code: "needs_login", message: "log in again", retryAfterMs: 250))
        }
        let error = await #expect(throws: BrokerError.self) { try await client.accessToken("a", from: broker) }
        #expect(error?.code == .needsLogin)
        #expect(error?.message == "log in again")
        #expect(error?.retryAfterMs == 250)
        try await serving.value
    }

    @Test(arguments: Client.allCases)
    func aConnectionClosedMidAnswerIsAConnectionError(client: Client) async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            let request = try peer.request()
            let answer = Peer.answer(request.id, result: Peer.token(account: "a", accessToken: "at-cut"))
            peer.write(String(answer.prefix(answer.count / 2)))
            peer.hangUp()
        }
        let error = await #expect(throws: ConnectionError.self) { try await client.accessToken("a", from: broker) }
        #expect(error?.description.contains("closed the connection") == true, "\(String(describing: error))")
        try await serving.value
    }

    @Test(arguments: Client.allCases)
    func anAnswerLongerThanTheLimitIsRefused(client: Client) async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            _ = try peer.request()
            // 16 MiB and a little more, with no newline; the write ends when the client hangs up.
            peer.write(String(repeating: "a", count: (16 << 20) + 65536))
        }
        let error = await #expect(throws: ConnectionError.self) { try await client.accessToken("a", from: broker) }
        #expect(error?.description.contains("longer than 16 MiB") == true, "\(String(describing: error))")
        try await serving.value
    }

    // MARK: The pipelined client

    @Test func requestsInFlightTogetherAreMatchedToTheirAnswersByID() async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            // All three arrive before any is answered: they are in flight together.
            let requests = try (0..<3).map { _ in try peer.request() }
            // Answered last first, two of them in one write.
            let answers = requests.reversed().map {
                Peer.answer($0.id, result: Peer.token(account: $0.account, accessToken: "at-\($0.account ?? "")"))
            }
            peer.write(answers[0] + answers[1])
            peer.write(answers[2])
            return Set(requests.compactMap(\.id)).count
        }
        let client = try BrokerClient(socketPath: broker.socketPath)
        defer { client.close() }
        async let a = client.token(account: "a")
        async let b = client.token(account: "b")
        async let c = client.token(account: "c")
        let tokens = try await [a, b, c].map(\.accessToken)
        #expect(tokens == ["at-a", "at-b", "at-c"])
        #expect(try await serving.value == 3, "each request carried an id of its own")
    }

    /// The connection breaks halfway through an answer: every call in flight fails with a
    /// `ConnectionError` at once, and the next call connects again.
    @Test func aConnectionClosedMidAnswerFailsEveryCallInFlight() async throws {
        let broker = try FakeBroker()
        let breaking = broker.serve { peer in
            let first = try peer.request()
            _ = try peer.request()
            let answer = Peer.answer(first.id, result: Peer.token(account: "a", accessToken: "at-cut"))
            peer.write(String(answer.prefix(answer.count / 2)))
            peer.hangUp()
        }
        let client = try BrokerClient(socketPath: broker.socketPath)
        defer { client.close() }
        async let first = Result { try await client.token(account: "a") }
        async let second = Result { try await client.token(account: "b") }
        for result in await [first, second] {
            let error = try #require(result.failure as? ConnectionError, "\(result)")
            #expect(error.description.contains("closed the connection"), "\(error)")
        }
        try await breaking.value

        let again = broker.serve { peer in
            let request = try peer.request()
            peer.write(Peer.answer(request.id, result: Peer.token(account: "a", accessToken: "at-again")))
        }
        #expect(try await client.token(account: "a").accessToken == "at-again")
        try await again.value
    }

    /// Every code of the contract arrives as a `BrokerError` with that code, its message and its
    /// retry hint; a code from a newer broker becomes `internal`.
    @Test func everyErrorCodeIsThrownAsABrokerErrorWithThatCode() async throws {
        let codes = BrokerError.Code.all.map(\.rawValue) + ["a_code_from_the_future"]
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            for code in codes {
                let request = try peer.request()
                peer.write(Peer.failure(request.id, code: code, message: "said \(code)", retryAfterMs: 1500))
            }
        }
        let client = try BrokerClient(socketPath: broker.socketPath)
        defer { client.close() }
        for code in codes {
            let error = await #expect(throws: BrokerError.self) { try await client.token(account: "a") }
            #expect(error?.code.rawValue == (code == codes.last ? "internal" : code))
            #expect(error?.message == "said \(code)")
            #expect(error?.retryAfterMs == 1500)
        }
        try await serving.value
    }

    /// A failure about the connection itself (no id, e.g. `forbidden`) fails every call in flight.
    @Test func aFailureWithoutAnIDFailsEveryCallInFlight() async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            _ = try peer.request()
            _ = try peer.request()
            peer.write(Peer.failure(nil, code: "forbidden", message: "not your broker"))
        }
        let client = try BrokerClient(socketPath: broker.socketPath)
        defer { client.close() }
        async let first = Result { try await client.token(account: "a") }
        async let second = Result { try await client.status() }
        let errors = await [first.failure, second.failure]
        #expect(errors.map { ($0 as? BrokerError)?.code } == [.forbidden, .forbidden], "\(errors)")
        try await serving.value
    }

    // MARK: The blocking client

    @Test func aBrokerThatDoesNotAnswerTimesOut() throws {
        // A socket that accepts connections (the kernel queues them) and never reads or answers.
        let broker = try FakeBroker()
        let client = BlockingBrokerClient(socketPath: broker.socketPath, timeout: .milliseconds(300))
        let error = #expect(throws: ConnectionError.self) { try client.perform(.token(account: "any")) }
        #expect(error?.description.contains("did not answer in time") == true, "\(String(describing: error))")
    }

    /// A `login` answer: each progress line of the request reaches the callback, in order (other
    /// ids' lines do not), `idle` runs while the broker is silent, and the final line's result
    /// is returned.
    @Test func progressLinesAreHandedOnUntilTheFinalLine() async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            let request = try peer.request()
            let id = try #require(request.id)
            peer.write(
                #"{"id":\#(Self.json(id)),"event":"device_code","user_code":"WDJB-MJHT","expires_in":600}"# + "\n")
            peer.write(#"{"id":999,"event":"slow_down","interval":10}"# + "\n")
            peer.pause(milliseconds: 300)
            peer.write(#"{"id":\#(Self.json(id)),"event":"slow_down","interval":10}"# + "\n")
            peer.write(Peer.answer(id, result: #"{"account":"work","state":"valid","id_token":true}"#))
            return request
        }
        let client = BlockingBrokerClient(socketPath: broker.socketPath, timeout: .milliseconds(50))
        var progress: [String] = []
        var idle = 0
        let call = BrokerCall.login(account: "work", flow: .device, secretsFile: "/proc/1/fd/0", timeout: 60)
        let result = try client.perform(call, idleInterval: .milliseconds(50), idle: { idle += 1 }) { line in
            progress.append(try Wire.makeDecoder().decode(LoginProgress.self, from: line).event.rawValue)
        }
        #expect(result == LoginResult(account: "work", state: "valid", idToken: true))
        #expect(progress == ["device_code", "slow_down"])
        #expect(idle >= 2, "idle ran while the broker was silent, with no read timeout")
        let request = try await serving.value
        #expect(request.op == "login" && request.flow == "device" && request.timeout == 60)
        #expect(request.secretsFile == "/proc/1/fd/0")
    }

    /// `idle` runs on time even while progress lines keep coming (it is what notices Ctrl-C).
    @Test func idleRunsBetweenProgressLinesThatComeFast() async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            let request = try peer.request()
            let id = try #require(request.id)
            for _ in 0..<40 {
                peer.write(#"{"id":\#(Self.json(id)),"event":"slow_down","interval":10}"# + "\n")
                peer.pause(milliseconds: 10)
            }
            peer.write(Peer.answer(id, result: #"{"account":"work","state":"valid","id_token":false}"#))
        }
        let client = BlockingBrokerClient(socketPath: broker.socketPath)
        var idle = 0
        var progress = 0
        _ = try client.perform(.login(account: "work", flow: .device), idleInterval: .milliseconds(50)) {
            idle += 1
        } progress: { _ in
            progress += 1
        }
        #expect(progress == 40)
        #expect(idle >= 3, "lines every 10 ms for 400 ms, idle every 50 ms")
        try await serving.value
    }

    /// `idle` throwing (Ctrl-C, a deadline) ends the wait with its error and closes the
    /// connection, which is how the broker learns the login was given up.
    @Test func idleThrowingEndsTheWaitAndClosesTheConnection() async throws {
        struct Stop: Error {}
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            let request = try peer.request()
            peer.write(#"{"id":\#(Self.json(try #require(request.id))),"event":"authorization_url","url":"u"}"# + "\n")
            return peer.connection.waitForClose(seconds: 30)
        }
        let client = BlockingBrokerClient(socketPath: broker.socketPath)
        var idle = 0
        #expect(throws: Stop.self) {
            try client.perform(.login(account: "work", flow: .browser), idleInterval: .milliseconds(20)) {
                idle += 1
                if idle == 3 { throw Stop() }
            } progress: { _ in
            }
        }
        #expect(try await serving.value, "the client closed the connection")
    }

    /// The id token request carries `id_token`, so no path of the broker answers it with an
    /// access token.
    @Test func theIDTokenRequestSaysSo() async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            let request = try peer.request()
            peer.write(Peer.answer(request.id, result: #"{"account":"a","id_token":"h.p.s"}"#))
            return request
        }
        let client = BlockingBrokerClient(socketPath: broker.socketPath)
        #expect(try client.perform(.idToken(account: "a")).idToken == "h.p.s")
        let request = try await serving.value
        #expect(request.op == "token" && request.idToken == true)
    }

    private static func json(_ id: RequestID) -> String {
        String(decoding: (try? JSONEncoder().encode(id)) ?? Data("null".utf8), as: UTF8.self)
    }

    /// brokerctl asks with the blocking client: while it waits for its one answer, it runs on
    /// its main thread alone.
    @Test func aSingleBlockingRequestStartsNoThread() async throws {
        let broker = try FakeBroker()
        let serving = broker.serve { peer in
            let request = try peer.request()
            guard let pid = peer.clientPID else { throw HarnessError("no peer credentials") }
            let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
            let threads = status.split(separator: "\n").first { $0.hasPrefix("Threads:") }
            peer.write(Peer.answer(request.id, result: Peer.token(account: request.account, accessToken: "at-cli")))
            return threads.map { $0.split(separator: "\t").last.map(String.init) ?? "" }
        }
        var environment = ProcessInfo.processInfo.environment
        environment["TOKENBROKER_SOCKET"] = broker.socketPath
        let result = try await ChildProcess.run(
            BrokerProcess.binary("brokerctl").path, ["token", "api"], environment: environment)
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output == "at-cli\n")
        #expect(try await serving.value == "1", "threads of brokerctl while it waited for its answer")
    }
}
