import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Many tools wanting one account that needs a login at once: one sign-in at the IdP, one
/// browser window, one desktop notification, and every caller served when it is done. Real
/// brokerd, brokerctl and git processes; the test IdP; a session bus of the test's own.
@Suite struct LoginStormTests {
    @Test func tenCallersOfAnAccountThatNeedsALoginShareOneSignIn() async throws {
        let bus = try await TestSessionBus()
        defer { bus.stop() }
        let idp = try await OAuth2TestIdP()
        let broker = try BrokerProcess()
        let bin = try TemporaryDirectory()
        defer { bin.remove() }
        do {
            try await storm(broker: broker, idp: idp, bus: bus, bin: bin)
        } catch {
            broker.stop()
            await idp.shutdown()
            throw error
        }
        broker.stop()
        await idp.shutdown()
    }

    private func storm(broker: BrokerProcess, idp: OAuth2TestIdP, bus: TestSessionBus, bin: TemporaryDirectory)
        async throws
    {
        try broker.writeConfig(
            """
            [accounts.work]
            kind = "oauth2"
            issuer = "\(idp.issuer)"
            client_id = "\(idp.clientID)"
            scope = "openid offline_access"

            [accounts.work.git]
            hosts = ["git.example"]
            """)
        try await broker.start(environment: ["DBUS_SESSION_BUS_ADDRESS": bus.address])
        // A refresh token the IdP does not know: the first refresh is denied.
        let pushed = try broker.brokerctl(["set-tokens", "work"], stdin: #"{"refresh_token":"rt-the-idp-forgot"}"#)
        #expect(pushed.status == 0, "\(pushed.stderr)")
        #expect(
            try await eventually(timeout: 30) {
                try LoginCommandTests.status(broker, "work")?["state"] as? String == "needs_login"
            })
        #expect(await eventually { bus.notifications.count == 1 }, "a notification when work needs a login")

        // Every xdg-open call adds a line to `opened`.
        try "#!/bin/sh\nprintf '%s\\n' \"$1\" >> \(bin.file("opened"))\n".write(
            toFile: bin.file("xdg-open"), atomically: true, encoding: .utf8)
        chmod(bin.file("xdg-open"), 0o755)
        let gitConfig = bin.file("gitconfig")
        try "[credential]\n\thelper = \"!\(BrokerProcess.binary("brokerctl").path) git-credential\"\n".write(
            toFile: gitConfig, atomically: true, encoding: .utf8)
        let desktop = [
            "DISPLAY": ":9", "PATH": bin.path + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"),
            "GIT_CONFIG_GLOBAL": gitConfig, "GIT_CONFIG_NOSYSTEM": "1", "GIT_ASKPASS": "", "SSH_ASKPASS": "",
            "GIT_TERMINAL_PROMPT": "",
        ]
        let callers = try (0..<10).map { index in
            index % 2 == 0
                ? try BackgroundBrokerctl(broker, ["login", "work"], environment: desktop)
                : try BackgroundBrokerctl(
                    broker, ["credential", "fill"], program: "/usr/bin/git",
                    stdin: "protocol=https\nhost=git.example\n\n", environment: desktop)
        }
        let joinedText = "a sign-in for work is already open; waiting for it"
        #expect(
            await eventually(timeout: 60) { callers.filter { $0.stderr.contains(joinedText) }.count == 9 },
            "\(callers.map(\.stderr))")
        let opened = try #require(
            try String(contentsOfFile: bin.file("opened"), encoding: .utf8).split(separator: "\n").first)
        let browser = TestBrowser()
        #expect(try await browser.signIn(try browser.follow(pageAt: String(opened))).status == 200)

        var statuses: [Int32] = []
        for caller in callers { statuses.append(await caller.finish()) }
        #expect(statuses == Array(repeating: 0, count: 10), "\(callers.map(\.stderr))")
        let token = try #require(idp.issuedAccessTokens.last)
        for (index, caller) in callers.enumerated() {
            if index % 2 == 0 {
                #expect(caller.stdout == "logged in work (valid)\n")
            } else {
                #expect(caller.stdout.contains("password=\(token)\n"), "git credential fill got the new token")
            }
        }
        let opens = try String(contentsOfFile: bin.file("opened"), encoding: .utf8).split(separator: "\n")
        #expect(opens.count == 1, "one browser window")
        #expect(idp.authorizationRequests == 1, "one flow at the IdP")
        #expect(idp.deviceAuthorizations == 0)
        #expect(idp.calls.filter { $0.grantType == "authorization_code" }.count == 1)
        try await Task.sleep(for: .milliseconds(500))
        let notifications = bus.notifications
        #expect(notifications.count == 1, "one notification for one change of state")
        let notice = try #require(notifications.first)
        #expect(notice["app"] == "tokenbroker")
        #expect(notice["summary"]?.contains("work") == true && notice["body"]?.contains("brokerctl login work") == true)
        let secrets = idp.issuedAccessTokens + idp.issuedRefreshTokens + idp.issuedIDTokens + ["rt-the-idp-forgot"]
        #expect(!secrets.contains { secret in notice.values.contains { $0.contains(secret) } }, "no secret shown")
    }
}
