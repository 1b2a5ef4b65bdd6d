import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

/// `TOKENBROKER_EVENT_LOOPS`: how many event-loop threads brokerd runs.
@Suite struct EventLoopTests {
    @Test(arguments: [1, 2, 5])
    func runsTheEventLoopsAskedFor(count: Int) async throws {
        let broker = try BrokerProcess()
        try await broker.start(environment: ["TOKENBROKER_EVENT_LOOPS": String(count)])
        defer { broker.stop() }
        try await expectServing(broker)
        #expect(try eventLoopThreads(of: broker, expected: count) == count)
    }

    /// The default chosen by bench/run's figures on 2 cores (docs/performance.md, "Event loops").
    @Test func runsOneEventLoopByDefault() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        try await expectServing(broker)
        #expect(try eventLoopThreads(of: broker, expected: 1) == 1)
    }

    @Test(arguments: ["0", "65", "two", "1.5", "", "-1", "+64 ", "99999999999999999999"])
    func refusesToStartWithACountItCannotUse(value: String) async throws {
        let broker = try BrokerProcess()
        await #expect(throws: (any Error).self) {
            try await broker.start(environment: ["TOKENBROKER_EVENT_LOOPS": value])
        }
        #expect(broker.stop() != 0)
        #expect(broker.log.contains("TOKENBROKER_EVENT_LOOPS must be a whole number from 1 to 64"))
    }

    private func expectServing(_ broker: BrokerProcess) async throws {
        let client = try broker.client()
        defer { client.close() }
        #expect(try await client.hello().protocol == 1)
    }

    /// The threads of NIO's singleton event-loop group in brokerd, counted by name; the names
    /// of all its threads are recorded when the count is not `expected`.
    private func eventLoopThreads(of broker: BrokerProcess, expected: Int) throws -> Int {
        let process = try #require(broker.process)
        let count = process.threads(named: "NIO-SGLTN-")
        if count != expected { Issue.record("brokerd's threads: \(process.threadNames())") }
        return count
    }
}
