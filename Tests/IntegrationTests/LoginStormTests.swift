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
        try await Self.withBrokerAndBus { broker, idp, bus, bin in
            try await storm(broker: broker, idp: idp, bus: bus, bin: bin)
        }
    }

    /// Runs `body` with a broker (not started), the test IdP, a session bus and a directory
    /// for scripts, all stopped or removed on every way out.
    static func withBrokerAndBus(
        _ body: (BrokerProcess, OAuth2TestIdP, TestSessionBus, TemporaryDirectory) async throws -> Void
    ) async throws {
        let bus = try await TestSessionBus()
        defer { bus.stop() }
        let idp = try await OAuth2TestIdP()
        let broker = try BrokerProcess()
        let bin = try TemporaryDirectory()
        defer { bin.remove() }
        try await withCleanup {
            try await body(broker, idp, bus, bin)
        } cleanup: {
            broker.stop()
            await idp.shutdown()
        }
    }

    private func storm(broker: BrokerProcess, idp: OAuth2TestIdP, bus: TestSessionBus, bin: TemporaryDirectory)
        async throws
    {
        try await Self.startNeedingALogin(broker, idp: idp, bus: bus, bin: bin, settings: "")
        #expect(await eventually { bus.notifications.count == 1 }, "a notification when work needs a login")
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
        // brokerd sends its notice to the test's session bus as work enters needs_login.
        #expect(await eventually { !bus.notifications.isEmpty })
        let notifications = bus.notifications
        #expect(notifications.count == 1, "one notification for one change of state")
        let notice = try #require(notifications.first)
        #expect(notice["app"] == "tokenbroker")
        #expect(notice["summary"]?.contains("work") == true && notice["body"]?.contains("brokerctl login work") == true)
        let secrets = idp.issuedAccessTokens + idp.issuedRefreshTokens + idp.issuedIDTokens + ["rt-the-idp-forgot"]
        #expect(!secrets.contains { secret in notice.values.contains { $0.contains(secret) } }, "no secret shown")
    }

    /// Nobody there to sign in: git with `GIT_TERMINAL_PROMPT=0`, or a helper told
    /// `--no-login`, fails at once and starts no flow (no browser, nothing at the IdP); with
    /// `desktop_notifications = false` no notification is shown, and a broker whose session bus
    /// has gone keeps serving.
    @Test func nobodyThereMeansNoSignInAndNotificationsCanBeTurnedOff() async throws {
        try await Self.withBrokerAndBus { broker, idp, bus, bin in
            try await Self.startNeedingALogin(
                broker, idp: idp, bus: bus, bin: bin, settings: "[broker]\ndesktop_notifications = false\n")
            let brokerctl = BrokerProcess.binary("brokerctl").path
            for (helper, prompt) in [("git-credential", "0"), ("git-credential --no-login", "")] {
                let gitConfig = bin.file("gitconfig")
                try "[credential]\n\thelper = \"!\(brokerctl) \(helper)\"\n".write(
                    toFile: gitConfig, atomically: true, encoding: .utf8)
                let fill = try BackgroundBrokerctl(
                    broker, ["credential", "fill"], program: "/usr/bin/git",
                    stdin: "protocol=https\nhost=git.example\n\n",
                    environment: [
                        "DISPLAY": ":9",
                        "PATH": bin.path + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"),
                        "GIT_CONFIG_GLOBAL": gitConfig, "GIT_CONFIG_NOSYSTEM": "1", "GIT_ASKPASS": "",
                        "SSH_ASKPASS": "", "GIT_TERMINAL_PROMPT": prompt,
                    ])
                #expect(await fill.finish() != 0, "\(helper), GIT_TERMINAL_PROMPT=\(prompt): no password")
                #expect(!fill.stdout.contains("password="))
            }
            #expect(!FileManager.default.fileExists(atPath: bin.file("opened")), "no browser window")
            #expect(idp.authorizationRequests == 0 && idp.deviceAuthorizations == 0, "no flow at the IdP")
            // The notice would have been sent when work entered needs_login, before the helpers ran.
            #expect(bus.notifications.isEmpty, "desktop_notifications = false")

            // The bus goes away; a change of state with notifications on sends nowhere, and serves on.
            bus.stop()
            try broker.writeConfig(
                """
                [accounts.work]
                kind = "oauth2"
                issuer = "\(idp.issuer)"
                client_id = "\(idp.clientID)"
                """)
            #expect(try await broker.brokerctl(["reload"]).status == 0)
            _ = try await broker.brokerctl(["set-tokens", "work"], stdin: #"{"refresh_token":"rt-gone"}"#)
            #expect(
                try await eventually(timeout: 30) {
                    try await LoginCommandTests.status(broker, "work")?["state"] as? String == "needs_login"
                })
            let pushed2 = try await broker.brokerctl(
                ["set-tokens", "work"], stdin: #"{"refresh_token":"rt-0"}"#)
            #expect(pushed2.status == 0, "\(pushed2.stderr)")
            #expect(
                try await broker.brokerctl(["token", "work"]).stdout == (idp.issuedAccessTokens.last ?? "?")
                    + "\n")
        }
    }

    /// Starts `broker` with `settings` and the account `work` (its git host `git.example`) on
    /// `bus`, holding a refresh token the IdP does not know, and waits for the denial that
    /// makes it need a login; `bin` gets an `xdg-open` that adds each address to `opened`.
    static func startNeedingALogin(
        _ broker: BrokerProcess, idp: OAuth2TestIdP, bus: TestSessionBus, bin: TemporaryDirectory, settings: String
    ) async throws {
        try broker.writeConfig(
            settings + """
                [accounts.work]
                kind = "oauth2"
                issuer = "\(idp.issuer)"
                client_id = "\(idp.clientID)"
                scope = "openid offline_access"

                [accounts.work.git]
                hosts = ["git.example"]
                """)
        try await broker.start(environment: ["DBUS_SESSION_BUS_ADDRESS": bus.address])
        let pushed = try await broker.brokerctl(
            ["set-tokens", "work"], stdin: #"{"refresh_token":"rt-the-idp-forgot"}"#)
        #expect(pushed.status == 0, "\(pushed.stderr)")
        #expect(
            try await eventually(timeout: 30) {
                try await LoginCommandTests.status(broker, "work")?["state"] as? String == "needs_login"
            })
        try "#!/bin/sh\nprintf '%s\\n' \"$1\" >> \(bin.file("opened"))\n".write(
            toFile: bin.file("xdg-open"), atomically: true, encoding: .utf8)
        chmod(bin.file("xdg-open"), 0o755)
    }
}
