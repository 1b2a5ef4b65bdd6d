import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// brokerd as a daemon: private socket, sd_notify readiness and shutdown, config file, timeouts.
@Suite struct DaemonLifecycleTests {
    @Test func socketIsPrivate() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        var info = stat()
        #expect(stat(broker.socketPath, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
        let directory = URL(fileURLWithPath: broker.socketPath).deletingLastPathComponent().path
        #expect(stat(directory, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o700)
    }

    @Test func notifiesReadyOnlyWhenServingThenStoppingOnSIGTERM() async throws {
        let broker = try BrokerProcess()
        let notifyPath = broker.root.appendingPathComponent("notify.sock").path
        let notify = try DatagramListener(path: notifyPath)
        try await broker.startWithNotifySocket(notifyPath)
        var ready: String?
        while ready == nil, let message = notify.receive() {
            if message.contains("READY=1") { ready = message }
        }
        // Once READY=1 has arrived, the socket already answers token requests.
        #expect(ready?.contains("STATUS=0 accounts") == true)
        let client = try broker.client()
        #expect(try await client.hello().protocol == 1)
        client.close()
        #expect(broker.stop() == 0)
        var messages: [String] = []
        while let message = notify.receive(timeout: 2) { messages.append(message) }
        #expect(messages.contains("STOPPING=1"))
    }

    @Test func brokenConfigStopsStartWithTheLineNamed() async throws {
        let broker = try BrokerProcess()
        try FileManager.default.createDirectory(at: broker.configDirectory, withIntermediateDirectories: true)
        try "[broker]\nrefresh_floor = 30\nrequest_timeout = = 3\n".write(
            to: broker.configDirectory.appendingPathComponent("broker.toml"), atomically: true, encoding: .utf8)
        #expect(try await broker.runExpectingExit() != 0)
        #expect(broker.log.contains("broker.toml line 3"))
    }

    @Test func aHangingIdPTimesOutAndTheBrokerKeepsServing() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-hang", lifetime: 3600)
        idp.setBehavior(.hang)
        let broker = try BrokerProcess()
        try FileManager.default.createDirectory(at: broker.configDirectory, withIntermediateDirectories: true)
        // A long backoff, so no jittered background retry is under way when the state is read.
        try "[broker]\nrequest_timeout = 1\nconnect_timeout = 1\nbackoff_base = 60\nbackoff_cap = 60\n".write(
            to: broker.configDirectory.appendingPathComponent("broker.toml"), atomically: true, encoding: .utf8)
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        _ = try await client.add(
            account: "other", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "fine", expiresIn: 600))
        _ = try await client.add(
            account: "slow",
            provider: ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
            tokens: TokenSet(refreshToken: "rt-hang"))

        async let hanging = Result { try await client.token(account: "slow") }
        #expect(try await client.token(account: "other").accessToken == "fine")
        let outcome = await hanging
        #expect(throws: BrokerError.self) { try outcome.get() }
        if case .failure(let error as BrokerError) = outcome {
            #expect(error.code == .unavailable)
            #expect(error.message.contains("timed out"))
            #expect(error.retryAfterMs != nil)
        }
        // A refresh the request started beside the one `add` started times out as well.
        #expect(await eventually { (try? await client.status(account: "slow"))?.first?.state == "unavailable" })
        await idp.shutdown()
    }

    /// docs/limits.md: after an outage, `brokerctl token` works again within seconds of the
    /// IdP's return, before the broker's own retry (up to 10 minutes off) and without `refresh`.
    @Test func aTokenIsServedSecondsAfterTheIdPRecovers() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-back", lifetime: 3600)
        idp.setBehavior(.status(503, retryAfter: nil))
        let broker = try BrokerProcess()
        try FileManager.default.createDirectory(at: broker.configDirectory, withIntermediateDirectories: true)
        // Retry-After-less 503s: the schedule backs off 0 to 600 s (full jitter).
        try "[broker]\nbackoff_base = 600\nbackoff_cap = 600\n".write(
            to: broker.configDirectory.appendingPathComponent("broker.toml"), atomically: true, encoding: .utf8)
        try await broker.start()
        defer { broker.stop() }
        let add = try await broker.brokerctl(
            [
                "add", "back", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id", idp.clientID,
                "--secrets", "-",
            ], stdin: #"{"refresh_token":"rt-back"}"#)
        #expect(add.status == 0, "\(add.stderr)")
        let down = try await broker.brokerctl(["token", "back"])
        #expect(down.status == 6, "unavailable while the IdP is down: \(down.stderr)")
        let client = try broker.client()
        defer { client.close() }
        let retry = try #require(try await client.status(account: "back").first?.nextRefreshAt)

        idp.setBehavior(.normal)
        let back = ContinuousClock.now
        let backAt = Date()
        var served = (status: Int32(-1), stdout: "", stderr: "")
        _ = try await eventually(timeout: 20) {
            served = try await broker.brokerctl(["token", "back"])
            return served.status == 0
        }
        let waited = ContinuousClock.now - back
        #expect(served.status == 0, "\(served.stderr)")
        #expect(idp.issuedAccessTokens.contains(String(served.stdout.dropLast())))
        #expect(waited < .seconds(10), "served \(waited) after the IdP came back")
        // Served before the schedule's retry, unless the jitter put that retry within seconds.
        #expect(Date() < retry || retry.timeIntervalSince(backAt) < 10, "the schedule's retry served it")
        await idp.shutdown()
    }

    /// `--log-level` wins over `TOKENBROKER_LOG_LEVEL`, `info` is the default (no debug line for
    /// a failed request), and a level that is none stops brokerd without repeating it.
    @Test func theLogLevelComesFromTheOptionOrTheEnvironment() async throws {
        let refused = try BrokerProcess()
        await #expect(throws: HarnessError.self) {
            try await refused.start(environment: ["TOKENBROKER_LOG_LEVEL": "loudest"])
        }
        #expect(refused.log.contains("must be one of trace, debug, info"), "\(refused.log)")
        #expect(!refused.log.contains("loudest"))

        let cases: [(arguments: [String], environment: [String: String], debug: Bool)] = [
            ([], [:], false), ([], ["TOKENBROKER_LOG_LEVEL": "debug"], true),
            (["--log-level", "debug"], ["TOKENBROKER_LOG_LEVEL": "error"], true),
            (["--log-level", "info"], ["TOKENBROKER_LOG_LEVEL": "debug"], false),
        ]
        for (arguments, environment, debug) in cases {
            let broker = try BrokerProcess()
            try await broker.start(arguments: arguments, environment: environment)
            let connection = try RawConnection(path: broker.socketPath)
            let answer = connection.request(#"{"id":1,"op":"token","account":"missing"}"#)
            #expect(answer?.contains("not_found") == true)
            broker.stop()
            #expect(broker.log.contains("request failed") == debug, "\(arguments) \(environment): \(broker.log)")
            #expect(broker.log.contains("code=not_found") == debug)
        }
    }
}
