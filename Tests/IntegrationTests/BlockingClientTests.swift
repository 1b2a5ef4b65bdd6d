import BrokerClient
import BrokerProtocol
import FoundationEssentials
import Synchronization
import TestSupport
import Testing

/// `BlockingBrokerClient`: one request per connection, answered on the calling thread.
@Suite struct BlockingClientTests {
    @Test func requestsAreAnsweredAndFailuresThrownAsTheirErrors() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = BlockingBrokerClient(socketPath: broker.socketPath, timeout: .seconds(30))
        let added = try client.perform(
            .add(
                account: "cli", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: "cli-token", expiresIn: 3600)))
        #expect(added.account == "cli")
        let token = try client.perform(.token(account: "cli", minTTL: 60))
        #expect(token.accessToken == "cli-token")
        #expect(token.expiresIn > 3000)
        #expect(try client.perform(.status()).accounts.map(\.account) == ["cli"])
        #expect(try client.perform(.hello(client: "tests")).protocol == 1)

        let missing = #expect(throws: BrokerError.self) { try client.perform(.token(account: "nobody")) }
        #expect(missing?.code == .notFound)
    }

    @Test func watchHandsOverEventsUntilTheBodyStops() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = BlockingBrokerClient(socketPath: broker.socketPath, timeout: .seconds(30))
        struct Enough: Error {}
        let done = Mutex(false)
        let watcher = Task.detached { () throws -> [String] in
            defer { done.withLock { $0 = true } }
            var seen: [String] = []
            do {
                try client.watch { event in
                    seen.append("\(event.event.rawValue) \(event.account)")
                    if seen.count == 2 { throw Enough() }
                }
            } catch is Enough {}
            return seen
        }
        // Accounts come and go until the watcher, once subscribed, has seen two of these events.
        var attempt = 0
        _ = try await eventually(timeout: 10) {
            let account = "w\(attempt)"
            _ = try client.perform(
                .add(
                    account: account, provider: ProviderSpec(kind: "static"),
                    tokens: TokenSet(accessToken: "t", expiresIn: 3600)))
            _ = try client.perform(.remove(account: account))
            attempt += 1
            return done.withLock { $0 }
        }
        let events = try await watcher.value
        #expect(events.count == 2)
        #expect(events.allSatisfy { $0.hasPrefix("added w") || $0.hasPrefix("removed w") }, "\(events)")
    }

}
