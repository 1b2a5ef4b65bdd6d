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

/// `token` requests that miss the cache, and `reject`s, wait on their event loops
/// (`RefreshWaiters`) for one shared fetch: several connections (each a `ConnectionHandler` on a
/// `NIOAsyncTestingChannel` sharing one dispatcher) ask for the token of an expired `api`
/// account at once.
@Suite struct RefreshWaitersTests {
    final class Setup {
        let harness: BrokerHarness
        let dispatcher: RequestDispatcher
        let quota = ConnectionQuota(limits: ConnectionLimits())
        let policy = AccessPolicy(logger: Logger(label: "test"))
        let peer = PeerIdentity(pid: 1, uid: getuid(), gid: getgid())

        /// The harness's `api` account, added with a token the clock then leaves behind.
        init() async throws {
            harness = try await BrokerHarness.start()
            try await harness.addWithValidToken()
            harness.clock.advance(by: 3700)
            dispatcher = RequestDispatcher(broker: harness.broker, policy: policy)
        }

        /// A new connection whose handler shares this setup's dispatcher and quota.
        func connect() async throws -> NIOAsyncTestingChannel {
            #expect(quota.reserveConnection(uid: peer.uid) == nil)
            let caller = Caller(peer: peer, facts: ProcessFacts(executable: nil, unit: nil))
            let channel = try await NIOAsyncTestingChannel { [dispatcher, policy, quota] channel in
                let handler = ConnectionHandler(
                    dispatcher: dispatcher, access: CallerAccess(policy: policy, caller: caller), quota: quota,
                    limitLog: LimitLog(logger: Logger(label: "test")), logger: Logger(label: "test"),
                    tickFlush: TickFlush(eventLoop: channel.eventLoop))
                try channel.pipeline.syncOperations.addHandler(handler)
            }
            try await channel.connect(to: SocketAddress(unixDomainSocketPath: harness.directory.file("peer"))).get()
            return channel
        }

        /// The next line written to the peer of `channel`.
        func answer(on channel: NIOAsyncTestingChannel) async throws -> String {
            String(buffer: try await channel.waitForOutboundWrite(as: ByteBuffer.self))
        }

        func finish(_ channels: [NIOAsyncTestingChannel]) async {
            for channel in channels { _ = try? await channel.finish(acceptAlreadyClosed: true) }
            await harness.stop()
        }
    }

    @Test func theWaitersOfOneRefreshAllGetTheNewTokenFromOneIdPCall() async throws {
        let setup = try await Setup()
        let idpAnswers = setup.harness.idp.holdAnswers()
        let channels = try await (0..<3).asyncMap { _ in try await setup.connect() }
        for (index, channel) in channels.enumerated() {
            try await channel.writeInbound(ByteBuffer(string: #"{"id":\#(index),"op":"token","account":"api"}"# + "\n"))
        }
        #expect(setup.dispatcher.waiters.count == 3)
        idpAnswers.open()
        for (index, channel) in channels.enumerated() {
            let answer = try await setup.answer(on: channel)
            #expect(answer.hasPrefix(#"{"id":\#(index),"ok":true"#))
            let issued = setup.harness.idp.issuedAccessTokens
            // Checked outside #expect, whose failure message would print the token.
            let holdsIssued = issued.count == 1 && answer.contains(#""access_token":"\#(issued[0])""#)
            #expect(holdsIssued, "the answer does not hold the one token issued")
            #expect(try await channel.readInbound(as: ConnectionWork.self) == nil, "nothing went to the task")
        }
        #expect(setup.harness.idp.refreshCalls.count == 1)
        #expect(setup.dispatcher.waiters.count == 0)
        await setup.finish(channels)
    }

    /// `reject`s of the account's token wait together for one refresh; a later `reject` of the
    /// same, now replaced, token gets the new one without another IdP call.
    @Test func theRejectsOfOneTokenShareOneRefresh() async throws {
        let setup = try await Setup()
        let idpAnswers = setup.harness.idp.holdAnswers()
        let reject = #""op":"reject","account":"api","access_token":"at-pushed"}"# + "\n"
        let channels = try await (0..<3).asyncMap { _ in try await setup.connect() }
        for (index, channel) in channels.enumerated() {
            try await channel.writeInbound(ByteBuffer(string: #"{"id":\#(index),"# + reject))
        }
        #expect(setup.dispatcher.waiters.count == 3)
        idpAnswers.open()
        var answers: [String] = []
        for (index, channel) in channels.enumerated() {
            let answer = try await setup.answer(on: channel)
            #expect(answer.hasPrefix(#"{"id":\#(index),"ok":true"#))
            #expect(try await channel.readInbound(as: ConnectionWork.self) == nil, "nothing went to the task")
            answers.append(answer)
        }
        let late = try await setup.connect()
        try await late.writeInbound(ByteBuffer(string: #"{"id":9,"# + reject))
        answers.append(try await setup.answer(on: late))
        let issued = setup.harness.idp.issuedAccessTokens
        // Checked outside #expect, whose failure message would print the token.
        let allHoldIssued = issued.count == 1 && answers.allSatisfy { $0.contains(#""access_token":"\#(issued[0])""#) }
        #expect(allHoldIssued, "not every answer holds the one token issued")
        #expect(setup.harness.idp.refreshCalls.count == 1)
        #expect(setup.dispatcher.waiters.count == 0)
        await setup.finish(channels + [late])
    }

    @Test func aWaiterWhoseConnectionClosedIsDroppedAndTheOthersAreStillAnswered() async throws {
        let setup = try await Setup()
        let idpAnswers = setup.harness.idp.holdAnswers()
        let leaving = try await setup.connect()
        let staying = try await setup.connect()
        try await leaving.writeInbound(ByteBuffer(string: #"{"id":1,"op":"token","account":"api"}"# + "\n"))
        try await staying.writeInbound(ByteBuffer(string: #"{"id":2,"op":"token","account":"api"}"# + "\n"))
        #expect(setup.dispatcher.waiters.count == 2)

        try await leaving.close()
        #expect(setup.dispatcher.waiters.count == 1, "the closed connection's request no longer waits")
        idpAnswers.open()
        let answer = try await setup.answer(on: staying)
        #expect(answer.hasPrefix(#"{"id":2,"ok":true"#))
        #expect(try await leaving.readOutbound(as: ByteBuffer.self) == nil)
        await setup.finish([leaving, staying])
    }

    @Test func aFailedRefreshAnswersEveryWaiterWithItsError() async throws {
        let setup = try await Setup()
        let idpAnswers = setup.harness.idp.holdAnswers()
        setup.harness.idp.setBehavior(.status(503, retryAfter: 30))
        let channels = try await (0..<3).asyncMap { _ in try await setup.connect() }
        for (index, channel) in channels.enumerated() {
            try await channel.writeInbound(ByteBuffer(string: #"{"id":\#(index),"op":"token","account":"api"}"# + "\n"))
        }
        #expect(setup.dispatcher.waiters.count == 3)
        idpAnswers.open()
        var errors: [ErrorBody] = []
        for (index, channel) in channels.enumerated() {
            let answer = try JSONDecoder().decode(
                ErrorAnswer.self, from: Data(try await setup.answer(on: channel).utf8))
            #expect(answer.id == .integer(Int64(index)) && !answer.ok)
            errors.append(answer.error)
        }
        #expect(errors.count == 3 && errors.allSatisfy { $0 == errors[0] }, "one error for all: \(errors)")
        #expect(setup.harness.idp.refreshCalls.count == 1)
        await setup.finish(channels)
    }
}

/// An error line as the wire gives it.
private struct ErrorAnswer: Decodable {
    var id: RequestID
    var ok: Bool
    var error: ErrorBody
}

extension Sequence {
    /// `map` with an `async` transform, one element after the other.
    fileprivate func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var results: [T] = []
        for element in self { results.append(try await transform(element)) }
        return results
    }
}
