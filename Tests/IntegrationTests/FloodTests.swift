import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// One local process flooding the socket cannot exhaust the broker: every kind of flood is
/// bounded (`ConnectionLimits`), and a well-behaved client on another connection is served.
@Suite(.serialized) struct FloodTests {
    private static let cachedToken = #"{"id":1,"op":"token","account":"steady"}"# + "\n"

    /// Starts a broker holding the static account `steady` with a token of realistic size.
    /// A broker serving one account; `settings`, lines of its `[broker]` table.
    private func startBroker(settings: String = "") async throws -> BrokerProcess {
        let broker = try BrokerProcess()
        try broker.writeConfig("[broker]\n\(settings)\n")
        try await broker.start()
        let owner = try RawConnection(path: broker.socketPath)
        let token = String(repeating: "t", count: 800)
        owner.send(
            #"{"id":1,"op":"add","account":"steady","provider":{"kind":"static"},"tokens":{"access_token":"\#(token)","expires_in":3600}}"#
                + "\n")
        #expect(owner.readObject()?["ok"] as? Bool == true)
        return broker
    }

    @Test func aClientThatPipelinesWithoutReadingIsNoLongerReadAndOthersAreServed() async throws {
        let broker = try await startBroker()
        defer { broker.stop() }
        let steady = try SteadyClient(path: broker.socketPath, account: "steady")
        let before = try broker.residentKiB()

        // 4 MiB of requests: cached tokens (answered inline, 1 KiB each) and hellos (run on the
        // broker), from a client that never reads. Unbounded, the answers would take ~90 MiB.
        let chunk = Array((String(repeating: Self.cachedToken, count: 9) + #"{"id":2,"op":"hello"}"# + "\n").utf8)
        var flood: [UInt8] = []
        while flood.count < 4 << 20 { flood += chunk }
        let flooder = try RawConnection(path: broker.socketPath)
        let sent = flooder.sendUntilStalled(flood, seconds: 3)
        let growth = try broker.residentKiB() - before
        #expect(sent < flood.count, "the broker read every request of a client that reads no answer")
        #expect(growth < 16 * 1024, "brokerd grew by \(growth) KiB")

        let fresh = try RawConnection(path: broker.socketPath)
        fresh.send(Self.cachedToken)
        #expect(fresh.readObject()?["ok"] as? Bool == true)
        // The flooder is held back, not dropped: as it reads, it is answered and read again.
        var answered = 0
        while answered < 2000, let answer = flooder.readObject(), answer["ok"] as? Bool == true { answered += 1 }
        #expect(answered == 2000)
        let (answers, failures) = steady.stop()
        #expect(answers > 0)
        #expect(failures == 0)
    }

    @Test func subscriptionsPerConnectionAreCappedWithBusy() async throws {
        let broker = try await startBroker()
        defer { broker.stop() }
        let limit = 64
        let subscriber = try RawConnection(path: broker.socketPath)
        for index in 0...limit { subscriber.send(#"{"id":\#(index),"op":"subscribe"}"# + "\n") }
        var answers: [[String: Any]] = []
        for _ in 0...limit { answers.append(try #require(subscriber.readObject())) }
        #expect(answers.prefix(limit).allSatisfy { $0["ok"] as? Bool == true })
        let refused = try #require(answers.last)
        #expect(refused.errorCode == "busy")
        #expect(refused["id"] as? Int == limit)
        #expect((refused["error"] as? [String: Any])?["retry_after_ms"] as? Int ?? 0 > 0)

        // The connection is still served, another one may subscribe, and every subscription
        // that was taken delivers.
        subscriber.send(Self.cachedToken)
        #expect(subscriber.readObject()?["ok"] as? Bool == true)
        let other = try RawConnection(path: broker.socketPath)
        other.send(#"{"id":"o","op":"subscribe"}"# + "\n")
        #expect(other.readObject()?["ok"] as? Bool == true)
        let owner = try RawConnection(path: broker.socketPath)
        owner.send(#"{"id":2,"op":"add","account":"new","provider":{"kind":"static"}}"# + "\n")
        #expect(owner.readObject()?["ok"] as? Bool == true)
        var events = 0
        while events < limit, let line = subscriber.readObject(), line["event"] as? String == "added" { events += 1 }
        #expect(events == limit)
        #expect(other.readObject()?["event"] as? String == "added")
    }

    @Test func subscriptionsPerUIDAreCappedWithBusy() async throws {
        let broker = try await startBroker()
        defer { broker.stop() }
        var subscribers: [RawConnection] = []
        for _ in 0..<16 {
            let connection = try RawConnection(path: broker.socketPath)
            for index in 0..<64 { connection.send(#"{"id":\#(index),"op":"subscribe"}"# + "\n") }
            for _ in 0..<64 { #expect(connection.readObject()?["ok"] as? Bool == true) }
            subscribers.append(connection)
        }
        let late = try RawConnection(path: broker.socketPath)
        late.send(#"{"id":"late","op":"subscribe"}"# + "\n")
        let refused = try #require(late.readObject())
        #expect(refused.errorCode == "busy")
        #expect((refused["error"] as? [String: Any])?["retry_after_ms"] as? Int ?? 0 > 0)

        // A subscriber that leaves gives its subscriptions back.
        subscribers.removeLast()
        #expect(
            await eventually(timeout: 5) {
                late.send(#"{"id":"again","op":"subscribe"}"# + "\n")
                return await late.nextObject()?["ok"] as? Bool == true
            })
    }

    @Test func connectionsOverThePerUIDLimitAreRefusedWhileOthersAreServed() async throws {
        let broker = try await startBroker()
        defer { broker.stop() }
        let served = try RawConnection(path: broker.socketPath)
        served.send(Self.cachedToken)
        #expect(served.readObject()?["ok"] as? Bool == true)
        // 1,024 connections in all, each answered once so the broker has admitted it.
        var others: [RawConnection] = []
        for _ in 1..<1024 {
            let connection = try RawConnection(path: broker.socketPath)
            connection.send(#"{"id":1,"op":"hello"}"# + "\n")
            #expect(connection.readObject()?["ok"] as? Bool == true)
            others.append(connection)
        }

        let extra = try RawConnection(path: broker.socketPath)
        let refused = try #require(extra.readObject())
        #expect(refused.errorCode == "busy")
        #expect((refused["error"] as? [String: Any])?["retry_after_ms"] as? Int ?? 0 > 0)
        #expect(extra.waitForClose(seconds: 5))

        served.send(Self.cachedToken)
        #expect(served.readObject()?["ok"] as? Bool == true)
        others[others.count - 1].send(#"{"id":2,"op":"hello"}"# + "\n")
        #expect(others[others.count - 1].readObject()?["ok"] as? Bool == true)

        // A connection that closes makes room for a new one.
        others.removeLast()
        #expect(
            try await eventually(timeout: 5) {
                let next = try RawConnection(path: broker.socketPath)
                next.send(#"{"id":3,"op":"hello"}"# + "\n")
                return await next.nextObject()?["ok"] as? Bool == true
            })
    }

    @Test func halfSentLinesAreTimedOutWhileOthersAreServed() async throws {
        let broker = try await startBroker(settings: "line_timeout = 0.5")
        defer { broker.stop() }
        let half = try RawConnection(path: broker.socketPath)
        half.send(#"{"id":1,"op":"tok"#)
        // A line sent a byte at a time is timed out from its first byte, however steady the drip.
        let drip = try RawConnection(path: broker.socketPath)
        let good = try RawConnection(path: broker.socketPath)
        var dripping = true
        _ = await eventually(timeout: 5) {
            dripping = drip.send("x")
            good.send(Self.cachedToken)
            #expect(await good.nextObject()?["ok"] as? Bool == true)
            return !dripping
        }
        #expect(!dripping, "a line sent a byte at a time stayed open for 5 s")
        #expect(drip.waitForClose(seconds: 2))
        #expect(half.waitForClose(seconds: 2))
        good.send(Self.cachedToken)
        #expect(good.readObject()?["ok"] as? Bool == true)
    }

    @Test func idleConnectionsAreClosedButSubscribersStay() async throws {
        let broker = try await startBroker(settings: "idle_connection_timeout = 0.5")
        defer { broker.stop() }
        let used = try RawConnection(path: broker.socketPath)
        used.send(Self.cachedToken)
        #expect(used.readObject()?["ok"] as? Bool == true)
        let silent = try RawConnection(path: broker.socketPath)
        let subscriber = try RawConnection(path: broker.socketPath)
        subscriber.send(#"{"id":"sub","op":"subscribe"}"# + "\n")
        #expect(subscriber.readObject()?["ok"] as? Bool == true)

        #expect(used.waitForClose(seconds: 5))
        #expect(silent.waitForClose(seconds: 5))
        let owner = try RawConnection(path: broker.socketPath)
        owner.send(#"{"id":2,"op":"add","account":"late","provider":{"kind":"static"}}"# + "\n")
        #expect(owner.readObject()?["ok"] as? Bool == true)
        let event = subscriber.readObject()
        #expect(event?["event"] as? String == "added")
        #expect(event?["account"] as? String == "late")
    }

    /// A program holding one BrokerClient across the idle timeout is served on its next call.
    @Test func theClientLibraryConnectsAgainAfterAnIdleClose() async throws {
        let broker = try await startBroker(settings: "idle_connection_timeout = 0.3")
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        _ = try await client.add(
            account: "idle", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "idle-token", expiresIn: 3600))
        // A connection opened after the client's last call: once brokerd closed it as idle, it
        // has closed the client's too.
        let later = try RawConnection(path: broker.socketPath)
        #expect(try await onOwnThread { later.waitForClose(seconds: 10) })
        #expect(try await client.token(account: "idle").accessToken == "idle-token")
        client.close()
        await #expect(throws: ConnectionError.self) { try await client.token(account: "idle") }
    }

    @Test func shutdownAnswersRunningRequestsAndClosesEveryConnection() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-slow", lifetime: 3600)
        idp.setBehavior(.hang)
        let broker = try BrokerProcess()
        try broker.writeConfig(
            "[broker]\nrequest_timeout = 1\nconnect_timeout = 1\nbackoff_base = 60\nbackoff_cap = 60\n")
        try await broker.start()
        defer { broker.stop() }
        let owner = try RawConnection(path: broker.socketPath)
        owner.send(
            #"{"id":1,"op":"add","account":"slow","provider":{"kind":"oauth2","token_endpoint":"\#(idp.tokenEndpoint)","client_id":"\#(idp.clientID)"},"tokens":{"refresh_token":"rt-slow"}}"#
                + "\n")
        #expect(owner.readObject()?["ok"] as? Bool == true)
        let subscriber = try RawConnection(path: broker.socketPath)
        subscriber.send(#"{"id":"sub","op":"subscribe"}"# + "\n")
        #expect(subscriber.readObject()?["ok"] as? Bool == true)
        let waiting = try RawConnection(path: broker.socketPath)
        waiting.send(#"{"id":"w","op":"token","account":"slow"}"# + "\n")
        // brokerd reads the request and joins it to the refresh the hanging IdP holds.
        usleep(200_000)

        // The running request is still answered (the IdP times out after 1 s), then every
        // connection is closed and brokerd exits cleanly.
        broker.signal(SIGTERM)
        let answer = waiting.readObject()
        #expect(answer?["id"] as? String == "w")
        #expect(answer?.errorCode == "unavailable")
        #expect(waiting.waitForClose(seconds: 10))
        #expect(owner.waitForClose(seconds: 10))
        #expect(subscriber.waitForClose(seconds: 10))
        #expect(broker.stop() == 0)
        await idp.shutdown()
    }

    @Test func halfSentLinesTogetherStayWithinTheSharedBudget() async throws {
        let broker = try await startBroker()
        defer { broker.stop() }
        let steady = try SteadyClient(path: broker.socketPath, account: "steady")
        let before = try broker.residentKiB()

        // 400 connections, each holding a line just under the 64 KiB limit without its newline.
        let almostWhole = [UInt8](repeating: UInt8(ascii: "a"), count: maximumLineLength - 1)
        let holders = try (0..<400).map { _ in try RawConnection(path: broker.socketPath) }
        for holder in holders { holder.send(almostWhole) }
        // brokerd reads what the 400 connections sent.
        usleep(500_000)
        let growth = try broker.residentKiB() - before
        #expect(growth < 16 * 1024, "brokerd grew by \(growth) KiB")
        let refused = holders.filter { $0.hasData(within: 0.05) && $0.readObject()?.errorCode == "busy" }.count
        #expect(refused > 0, "every one of 400 half-sent 64 KiB lines was held")
        #expect(refused < holders.count)
        let (answers, failures) = steady.stop()
        #expect(answers > 0)
        #expect(failures == 0)
    }
}
