import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
@testable import BrokerServer
import BrokerVault
import Foundation
import Logging
import NIOCore
import NIOEmbedded
import Testing
import TestSupport

/// `ConnectionHandler` on NIO's `EmbeddedChannel`: what is answered inline, what is handed to
/// the connection's task, and how the handler holds lines back, refuses and closes. Time is the
/// embedded loop's, moved by the test.
@Suite struct ConnectionHandlerTests {
    /// The in-process broker harness with one static account, `steady`, and one handler on an
    /// embedded channel.
    final class Setup {
        let harness: BrokerHarness
        var broker: Broker { harness.broker }
        let quota: ConnectionQuota
        let loop = EmbeddedEventLoop()
        let channel: EmbeddedChannel
        let peer = PeerIdentity(pid: 1, uid: getuid(), gid: getgid())

        init(limits: ConnectionLimits = ConnectionLimits()) async throws {
            let harness = try await BrokerHarness.start()
            self.harness = harness
            _ = try await harness.broker.add(
                account: "steady", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: "at-steady", expiresIn: 3600))
            quota = ConnectionQuota(limits: limits)
            #expect(quota.reserveConnection(uid: peer.uid) == nil)
            let policy = AccessPolicy(logger: Logger(label: "test"))
            let caller = Caller(peer: peer, facts: ProcessFacts(executable: nil, unit: nil))
            let handler = ConnectionHandler(
                dispatcher: RequestDispatcher(broker: harness.broker, policy: policy),
                access: CallerAccess(policy: policy, caller: caller), quota: quota,
                limitLog: LimitLog(logger: Logger(label: "test")), logger: Logger(label: "test"),
                tickFlush: TickFlush(eventLoop: loop))
            channel = EmbeddedChannel(handler: handler, loop: loop)
            try await channel.connect(to: SocketAddress(unixDomainSocketPath: harness.directory.file("peer"))).get()
        }

        func send(_ text: String) throws { try channel.writeInbound(ByteBuffer(string: text)) }

        /// Every line written to the peer so far.
        func answers() throws -> [String] {
            loop.run()
            var lines: [String] = []
            while let buffer = try channel.readOutbound(as: ByteBuffer.self) {
                lines += String(buffer: buffer).split(separator: "\n").map(String.init)
            }
            return lines
        }

        /// Every piece of work handed to the connection's task so far.
        func work() throws -> [ConnectionWork] {
            var items: [ConnectionWork] = []
            while let item = try channel.readInbound(as: ConnectionWork.self) { items.append(item) }
            return items
        }

        func finish() async {
            _ = try? channel.finish()
            await harness.stop()
        }
    }

    func ids(_ work: [ConnectionWork]) -> [String] {
        work.compactMap { item in
            guard case .run(let request) = item else { return nil }
            return request.id.map { "\($0)" }
        }
    }

    @Test func aCachedTokenIsAnsweredInlineAndNothingReachesTheTask() async throws {
        let setup = try await Setup()
        try setup.send(#"{"id":1,"op":"token","account":"steady"}"# + "\n")
        let answers = try setup.answers()
        #expect(answers.count == 1)
        #expect(answers.first?.contains(#""access_token":"at-steady""#) == true)
        #expect(try setup.work().isEmpty)
        await setup.finish()
    }

    @Test func malformedLinesGetAnErrorInlineAndTheConnectionStaysOpen() async throws {
        let setup = try await Setup()
        try setup.send("{\"id\":1,\"op\":\n[1,2\n{\"id\":2,\"op\":\"token\",\"account\":\"steady\"}\n")
        let answers = try setup.answers()
        #expect(answers.count == 3)
        #expect(answers[0].contains(#""code":"bad_request""#))
        #expect(answers[1].contains(#""code":"bad_request""#))
        #expect(answers[2].contains("at-steady"))
        #expect(setup.channel.isActive)
        await setup.finish()
    }

    @Test func requestsThatWaitOnTheBrokerAreHandedToTheTask() async throws {
        let setup = try await Setup()
        try setup.send(#"{"id":7,"op":"status"}"# + "\n")
        let work = try setup.work()
        #expect(work.count == 1)
        guard case .run(let request) = work.first else {
            Issue.record("expected a request, got \(work)")
            return
        }
        #expect(request.op == "status")
        #expect(try setup.answers().isEmpty)
        await setup.finish()
    }

    @Test func noMoreLinesAreTakenWhileTheConnectionHasItsMaximumOfRequestsRunning() async throws {
        var limits = ConnectionLimits()
        limits.requestsPerConnection = 2
        let setup = try await Setup(limits: limits)
        try setup.send((1...3).map { #"{"id":\#($0),"op":"status"}"# + "\n" }.joined())
        #expect(ids(try setup.work()) == ["1", "2"], "the third line waits")

        // One answer leaves: the waiting line is taken.
        try setup.channel.writeOutbound(ConnectionReply.answer(ByteBuffer(string: "{\"id\":1,\"ok\":true}\n")))
        setup.loop.run()
        #expect(ids(try setup.work()) == ["3"])
        #expect(try setup.answers() == [#"{"id":1,"ok":true}"#])
        await setup.finish()
    }

    @Test func aPeerThatDoesNotReadItsAnswersIsNotServedMore() async throws {
        let setup = try await Setup()
        setup.channel.isWritable = false
        setup.channel.pipeline.fireChannelWritabilityChanged()
        try setup.send(#"{"id":1,"op":"status"}"# + "\n")
        #expect(try setup.work().isEmpty, "nothing is taken while the peer's answers pile up")

        setup.channel.isWritable = true
        setup.channel.pipeline.fireChannelWritabilityChanged()
        #expect(ids(try setup.work()) == ["1"])
        await setup.finish()
    }

    @Test func anOversizedLineIsRefusedBeforeItEndsAndTheConnectionClosed() async throws {
        let setup = try await Setup()
        try setup.send(String(repeating: "x", count: maximumLineLength + 1))
        setup.loop.run()
        let answers = try setup.answers()
        #expect(answers.count == 1)
        #expect(answers.first?.contains(#""code":"line_too_long""#) == true)
        #expect(!setup.channel.isActive)
        await setup.finish()
    }

    @Test func aSubscriptionIsAcknowledgedAndItsEventsGoToTheTask() async throws {
        var limits = ConnectionLimits()
        limits.subscriptionsPerConnection = 1
        let setup = try await Setup(limits: limits)
        try setup.send(#"{"id":1,"op":"subscribe"}"# + "\n" + #"{"id":2,"op":"subscribe"}"# + "\n")
        let answers = try setup.answers()
        #expect(answers.count == 2)
        #expect(answers[0].contains(#""ok":true"#))
        #expect(answers[1].contains(#""code":"busy""#), "over the per-connection limit")
        let work = try setup.work()
        #expect(work.count == 1)
        if case .subscribe(let id, _)? = work.first { #expect(id == RequestID.integer(1)) }
        await setup.finish()
    }

    @Test func aHalfSentLineIsCutOffAtTheLineTimeout() async throws {
        let setup = try await Setup()
        try setup.send(#"{"id":1,"op":"tok"#)
        setup.loop.advanceTime(by: ConnectionLimits().lineTimeout - .milliseconds(1))
        #expect(setup.channel.isActive)
        setup.loop.advanceTime(by: .milliseconds(2))
        #expect(!setup.channel.isActive)
        await setup.finish()
    }

    @Test func anIdleConnectionIsClosedAtTheIdleTimeoutAndAnActiveOneIsNot() async throws {
        let setup = try await Setup()
        let half = TimeAmount.nanoseconds(ConnectionLimits().idleTimeout.nanoseconds / 2)
        setup.loop.advanceTime(by: half)
        try setup.send(#"{"id":1,"op":"token","account":"steady"}"# + "\n")
        setup.loop.advanceTime(by: half + .seconds(1))
        #expect(setup.channel.isActive, "the request restarted the idle clock")
        setup.loop.advanceTime(by: ConnectionLimits().idleTimeout)
        #expect(!setup.channel.isActive)
        await setup.finish()
    }

    @Test func closingGivesBackEverythingTheConnectionHeldOnTheQuota() async throws {
        var limits = ConnectionLimits()
        limits.requestsPerUID = 2
        let setup = try await Setup(limits: limits)
        try setup.send(#"{"id":1,"op":"status"}"# + "\n" + #"{"id":2,"op":"status"}"# + "\n")
        #expect(try setup.work().count == 2)
        #expect(!setup.quota.reserve(.request, uid: setup.peer.uid), "the uid is at its limit")
        _ = try setup.channel.finish()
        #expect(setup.quota.reserve(.request, uid: setup.peer.uid), "closing gave both back")
        await setup.finish()
    }
}
