import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `subscribe`: each change once, never a token; a subscriber that stops reading is dropped.
@Suite struct EventTests {
    @Test func eventsArriveOncePerChangeWithoutTokens() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-ev", lifetime: 3600)
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let owner = try broker.client()
        defer { owner.close() }
        let watcher = try broker.client()
        defer { watcher.close() }
        let events = try await watcher.events()
        let raw = try RawConnection(path: broker.socketPath)
        raw.send(#"{"id":"sub","op":"subscribe"}"# + "\n")
        #expect(raw.readObject()?["ok"] as? Bool == true)

        _ = try await owner.add(
            account: "ev",
            provider: ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
            tokens: TokenSet(refreshToken: "rt-ev"))
        _ = try await owner.token(account: "ev")
        idp.setBehavior(.status(500, retryAfter: nil))
        for _ in 0..<3 { _ = try? await owner.refresh(account: "ev") }
        idp.setBehavior(.normal)
        _ = try await owner.setTokens(account: "ev", tokens: TokenSet(refreshToken: "rt-burned"))
        _ = try? await owner.refresh(account: "ev")
        _ = try? await owner.token(account: "ev", minTTL: 7200)
        _ = try await owner.remove(account: "ev")

        var seen: [BrokerEvent.Kind] = []
        for try await event in events {
            #expect(event.account == "ev")
            seen.append(event.event)
            if event.event == .removed { break }
        }
        // New tokens while refreshes failed make the account usable again (`valid`).
        #expect(seen == [.added, .refreshed, .refreshFailed, .valid, .needsLogin, .removed])

        var rawLines: [String] = []
        while rawLines.count < seen.count, let line = raw.readLine() {
            rawLines.append(String(decoding: line, as: UTF8.self))
        }
        #expect(rawLines.count == seen.count)
        #expect(rawLines.allSatisfy { $0.hasPrefix(#"{"#) && $0.contains(#""id":"sub""#) })
        for secret in ["rt-ev", "rt-burned", idp.clientSecret] + idp.issuedAccessTokens + idp.issuedRefreshTokens {
            #expect(!rawLines.contains { $0.contains(secret) }, "an event line carries a secret")
        }
        await idp.shutdown()
    }

    /// `brokerctl watch --reconnect` shows the accounts' state first, keeps going when the
    /// broker stops and starts again on the same socket, and shows `valid` when `set-tokens`
    /// restores an account the IdP had refused (needs_login).
    @Test func watchOutlivesABrokerRestartAndShowsAnAccountBecomingValid() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-live", lifetime: 3600)
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let owner = try broker.client()
        _ = try await owner.add(
            account: "api",
            provider: ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
            tokens: TokenSet(refreshToken: "rt-refused"))
        owner.close()
        #expect(
            await eventually {
                (try? await broker.brokerctl(["status", "api"]))?.stdout.contains("needs login") == true
            })

        let outputPath = broker.root.appendingPathComponent("watch.out").path
        let output = open(outputPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        defer { close(output) }
        let watch = try ChildProcess.spawn(
            BrokerProcess.binary("brokerctl").path, ["watch", "--reconnect", "api"],
            environment: broker.environment.merging(["TOKENBROKER_SOCKET": broker.socketPath]) { $1 }, output: output)
        defer {
            kill(watch.pid, SIGTERM)
            watch.wait()
        }
        let lines = { ((try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "").split(separator: "\n") }
        #expect(await eventually { lines().contains { $0.contains("  state ") && $0.contains("api  needs_login") } })

        broker.stop()
        try await broker.start()
        #expect(await eventually { lines().contains { $0.contains("reconnected to the broker") } })
        #expect(!watch.hasExited())
        let pushed = try await broker.brokerctl(
            ["set-tokens", "api"], stdin: #"{"access_token":"at-pushed","expires_in":3600}"#)
        #expect(pushed.status == 0, "\(pushed.stderr)")
        #expect(
            await eventually {
                lines().drop { !$0.contains("reconnected to the broker") }.contains {
                    $0.split(separator: " ").map(String.init).filter { !$0.isEmpty }.dropFirst().prefix(2) == [
                        "valid", "api",
                    ]
                }
            }, "\(lines())")
        #expect(!lines().contains { $0.contains("at-pushed") || $0.contains("rt-refused") || $0.contains("rt-live") })
        await idp.shutdown()
    }

    @Test func aSubscriberThatStopsReadingIsDroppedAndOthersAreServed() async throws {
        let broker = try BrokerProcess()
        try FileManager.default.createDirectory(at: broker.configDirectory, withIntermediateDirectories: true)
        try "[broker]\nevent_buffer = 4\n".write(
            to: broker.configDirectory.appendingPathComponent("broker.toml"), atomically: true, encoding: .utf8)
        try await broker.start()
        defer { broker.stop() }
        let stalled = try RawConnection(path: broker.socketPath)
        stalled.send(#"{"id":1,"op":"subscribe"}"# + "\n")
        #expect(stalled.readObject()?["ok"] as? Bool == true)

        // Each add and remove is an event; far more than the socket buffers plus 4 can hold.
        let owner = try RawConnection(path: broker.socketPath)
        let padding = String(repeating: "p", count: 100)
        for index in 0..<1500 {
            let name = "acct-\(index)-\(padding)"
            owner.send(#"{"id":\#(index),"op":"add","account":"\#(name)","provider":{"kind":"static"}}"# + "\n")
            #expect(owner.readObject()?["ok"] as? Bool == true)
            owner.send(#"{"id":"r\#(index)","op":"remove","account":"\#(name)"}"# + "\n")
            #expect(owner.readObject()?["ok"] as? Bool == true)
        }
        // The broker still answers everyone else at once.
        owner.send(#"{"id":"h","op":"hello"}"# + "\n")
        #expect(owner.readObject()?["ok"] as? Bool == true)

        // The stalled subscriber finds its buffered events, then a final busy line, then the end.
        var last: [String: Any]?
        while let line = stalled.readObject() { last = line }
        #expect(last?.errorCode == "busy")
    }
}
