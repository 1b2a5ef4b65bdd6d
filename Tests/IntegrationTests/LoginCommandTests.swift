import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `brokerctl login` as a user runs it: real brokerd and brokerctl processes, the test IdP on
/// 127.0.0.1, and the test playing the user at the verification page or in the browser.
@Suite struct LoginCommandTests {
    /// The provider options of an account at `idp`, found by discovery.
    static func provider(_ idp: OAuth2TestIdP, scope: String = "openid offline_access") -> [String] {
        ["--issuer", idp.issuer, "--client-id", idp.clientID, "--scope", scope]
    }

    /// `status NAME --json`'s account object; `nil` when there is no such account.
    static func status(_ broker: BrokerProcess, _ account: String) async throws -> [String: Any]? {
        let result = try await broker.brokerctl(["status", account, "--json"])
        guard result.status == 0 else { return nil }
        let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
        return (object?["accounts"] as? [[String: Any]])?.first
    }

    /// Runs `body` with a started broker and a test IdP; both are stopped on every way out.
    static func withBrokerAndIdP(_ body: (BrokerProcess, OAuth2TestIdP) async throws -> Void) async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let idp = try await OAuth2TestIdP()
        do {
            try await body(broker, idp)
        } catch {
            await idp.shutdown()
            throw error
        }
        await idp.shutdown()
    }

    @Test func deviceFlowSignsInAndTheBrokerRefreshesWithTheStoredToken() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)
            let login = try BackgroundBrokerctl(broker, ["login", "work", "--flow", "device"] + Self.provider(idp))
            let link = try await login.deviceLink()
            #expect(login.stderr.contains("enter the code: "))
            #expect(try await idp.decide(.approve, at: link) == 200)
            #expect(await login.finish() == 0, "\(login.stderr)")
            #expect(login.stdout == "logged in work (valid)\n")
            #expect(!login.stderr.contains("\r"), "no progress line in a pipe")

            let status = try await Self.status(broker, "work")
            #expect(status?["state"] as? String == "valid")
            #expect(status?["provider"] as? String == "oauth2")
            let loginRefreshToken = try #require(idp.issuedRefreshTokens.last)
            let refreshed = try await broker.brokerctl(["refresh", "work"])
            #expect(refreshed.status == 0, "\(refreshed.stderr)")
            let refresh = idp.calls.last { $0.grantType == "refresh_token" }
            #expect(refresh?.refreshToken == loginRefreshToken, "the IdP sees the refresh token the login stored")
            #expect(
                try await broker.brokerctl(["token", "work"]).stdout == idp.issuedAccessTokens.last.map { $0 + "\n" })
        }
    }

    @Test func deviceFlowDeniedOrExpiredExitsFiveAndLeavesNoAccount() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)

            let denied = try BackgroundBrokerctl(
                broker, ["login", "denied", "--flow", "device", "--json"] + Self.provider(idp))
            let code = try await denied.jsonEvent("device_code")
            #expect(try await idp.decide(.deny, at: try #require(code["verification_uri_complete"] as? String)) == 200)
            #expect(await denied.finish() == 5)
            let error = denied.jsonLines.last
            #expect(error?["event"] as? String == "error")
            #expect(error?["code"] as? String == "needs_login")
            #expect((error?["message"] as? String)?.contains("access_denied") == true, "\(denied.stdout)")
            #expect(try await Self.status(broker, "denied") == nil, "no account after a denial")

            let expired = try BackgroundBrokerctl(
                broker, ["login", "expired", "--flow", "device"] + Self.provider(idp))
            _ = try await expired.deviceLink()
            idp.expireDeviceCodes()
            #expect(await expired.finish() == 5)
            #expect(expired.stderr.contains("expired"), "\(expired.stderr)")
            #expect(expired.stdout.isEmpty)
            #expect(try await Self.status(broker, "expired") == nil, "no account after an expired code")
        }
    }

    /// `--json` prints exactly the objects docs/login.md lists, and `slow_down` makes the broker poll
    /// 5 s less often.
    @Test func deviceFlowJSONLinesAndSlowDown() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1, expiresIn: 300)
            idp.forceSlowDown(1)
            let login = try BackgroundBrokerctl(
                broker, ["login", "slow", "--flow", "device", "--json"] + Self.provider(idp))
            let code = try await login.jsonEvent("device_code")
            #expect(
                Set(code.keys) == ["event", "verification_uri", "verification_uri_complete", "user_code", "expires_in"])
            #expect(code["expires_in"] as? Int == 300)
            let userCode = try #require(code["user_code"] as? String)
            #expect(
                code["verification_uri_complete"] as? String
                    == "\(code["verification_uri"] as? String ?? "")?user_code=\(userCode)")
            #expect(await eventually { idp.devicePolls.count >= 2 })
            #expect(
                try await idp.decide(.approve, at: try #require(code["verification_uri_complete"] as? String)) == 200)
            #expect(await login.finish() == 0, "\(login.stderr)")

            let polls = idp.devicePolls
            // The first poll was answered slow_down: the next came 1 + 5 s later, not 1 s.
            #expect(polls[1].timeIntervalSince(polls[0]) >= 5.5, "\(polls)")
            let lines = login.jsonLines
            #expect(lines.count == 2, "\(login.stdout)")
            #expect(lines.last as? [String: String] == ["event": "done", "account": "slow", "state": "valid"])
            #expect(login.stderr.isEmpty, "\(login.stderr)")
        }
    }

    /// The browser flow with `--no-browser`: the start link leads to the IdP; a redirect with a
    /// wrong `state` is refused (400) and the login keeps waiting; the right one signs in; the
    /// listener is closed afterwards; the same code replayed to another login is refused by the IdP.
    @Test func browserFlowChecksStateAndTheIdPRefusesAReusedCode() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            let login = try BackgroundBrokerctl(
                broker, ["login", "web", "--flow", "browser", "--no-browser", "--json"] + Self.provider(idp))
            let event = try await login.jsonEvent("authorization_url")
            #expect(Set(event.keys) == ["event", "url"])
            let start = try #require(event["url"] as? String)
            let browser = TestBrowser()
            let url = try await browser.start(start)
            #expect(queryValue("code_challenge_method", in: url) == "S256")
            let location = try await TestBrowser.authorize(url)
            let code = try #require(queryValue("code", in: location))
            let state = try #require(queryValue("state", in: location))
            let port = try #require(URLComponents(string: location)?.port)
            #expect(URLComponents(string: start)?.port == port)

            let forged = location.replacingOccurrences(of: "state=\(state)", with: "state=forged-\(state.prefix(8))")
            #expect(try await browser.visit(forged).status == 400)
            #expect(!login.child.hasExited(), "a wrong state does not end the login")
            let page = try await browser.visit(location)
            #expect(page.status == 200)
            #expect(page.body.contains("You may close this tab"))
            #expect(await login.finish() == 0, "\(login.stderr)")
            #expect(login.jsonLines.last as? [String: String] == ["event": "done", "account": "web", "state": "valid"])
            #expect(try await Self.status(broker, "web")?["state"] as? String == "valid")
            #expect(!TestBrowser.isListening(port, in: broker.pid), "the redirect listener is closed")

            // Another login receives the first login's code (with its own state, as an attacker
            // who saw the code would send it): the broker tries it and the IdP refuses it.
            let replay = try BackgroundBrokerctl(
                broker, ["login", "replay", "--flow", "browser", "--no-browser", "--json"] + Self.provider(idp))
            let replayBrowser = TestBrowser()
            let replayURL = try await replayBrowser.start(
                try #require(try await replay.jsonEvent("authorization_url")["url"] as? String))
            let redirect = try #require(queryValue("redirect_uri", in: replayURL))
            let replayState = try #require(queryValue("state", in: replayURL))
            _ = try await replayBrowser.visit("\(redirect)?code=\(code)&state=\(replayState)")
            #expect(await replay.finish() == 5)
            #expect(idp.rejectedCodeExchanges.last == "code already used")
            #expect(try await Self.status(broker, "replay") == nil)
        }
    }

    /// A local process floods the redirect port during a login: brokerd keeps its descriptors
    /// bounded, the login completes through a fresh callback, and every held connection is
    /// closed with the login.
    @Test func aFloodOfRedirectConnectionsKeepsBrokerdsDescriptorsBounded() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            let pid = try #require(broker.process?.pid)
            let descriptors = {
                (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? .max
            }
            let login = try BackgroundBrokerctl(
                broker, ["login", "web", "--flow", "browser", "--no-browser", "--json"] + Self.provider(idp))
            let url = try #require(try await login.jsonEvent("authorization_url")["url"] as? String)
            let port = try #require(URLComponents(string: url)?.port)
            let before = descriptors()
            let held = try (0..<100).map { _ in try HeldConnection(port: port) }
            defer { held.forEach { $0.close() } }
            #expect(await eventually { held.filter { $0.isClosedByPeer }.count >= held.count - 16 })
            // The 16 held ones, and a few of brokerd's own (a connection to the IdP, the vault).
            #expect(descriptors() <= before + 16 + 4, "\(before) before the flood")

            #expect(try await TestBrowser().signIn(url).status == 200)
            #expect(await login.finish() == 0, "\(login.stderr)")
            #expect(await eventually(timeout: 5) { held.allSatisfy { $0.isClosedByPeer } })
            #expect(await eventually(timeout: 5) { descriptors() <= before + 4 }, "\(before) before the flood")
        }
    }

    /// An `xdg-open` in `bin` that writes its argument to `bin/opened`; returns a PATH that
    /// finds it first.
    static func recordingXDGOpen(in bin: TemporaryDirectory) throws -> String {
        try "#!/bin/sh\nprintf '%s' \"$1\" > \(bin.file("opened"))\n".write(
            toFile: bin.file("xdg-open"), atomically: true, encoding: .utf8)
        chmod(bin.file("xdg-open"), 0o755)
        return bin.path + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
    }

    /// With a display and no `--flow`, the browser flow runs and `xdg-open PAGE` is started (a
    /// stand-in on `PATH` records its argument), the page leading to the start link and removed
    /// with the login; over SSH the device flow is the default.
    @Test func defaultFlowFollowsTheSessionAndOpensTheBrowser() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)
            let bin = try TemporaryDirectory()
            defer { bin.remove() }
            let path = try Self.recordingXDGOpen(in: bin)

            let desktop = try BackgroundBrokerctl(
                broker, ["login", "desk", "--json"] + Self.provider(idp), environment: ["DISPLAY": ":9", "PATH": path])
            let url = try #require(try await desktop.jsonEvent("authorization_url")["url"] as? String)
            let opened = try await desktop.waitFor("xdg-open's argument") { _ in
                (try? String(contentsOfFile: bin.file("opened"), encoding: .utf8)).flatMap { $0.isEmpty ? nil : $0 }
            }
            let browser = TestBrowser()
            #expect(try browser.follow(pageAt: opened) == url)
            #expect(try await browser.signIn(url).status == 200)
            #expect(await desktop.finish() == 0, "\(desktop.stderr)")
            #expect(!FileManager.default.fileExists(atPath: try #require(URL(string: opened)).path), "page removed")

            let remote = try BackgroundBrokerctl(
                broker, ["login", "ssh"] + Self.provider(idp),
                environment: ["DISPLAY": ":9", "SSH_CONNECTION": "10.0.0.1 5000 10.0.0.2 22", "PATH": path])
            let link = try await remote.deviceLink()
            #expect(try await idp.decide(.approve, at: link) == 200)
            #expect(await remote.finish() == 0, "\(remote.stderr)")
        }
    }

    /// With a display, brokerctl writes a 0600 page in a 0700 directory of its own and gives
    /// xdg-open only that page's name. While the login waits, neither the authorization URL,
    /// its `state` and `code_challenge`, nor the start link's key is in any process's arguments
    /// or environment; a callback with the right `state` and a code of another process's own
    /// completes nothing; the browser that followed the page finishes the login; the page and
    /// its directory are gone afterwards.
    @Test func theAuthorizationURLIsInNoProcessArgumentsOrEnvironment() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            let bin = try TemporaryDirectory()
            defer { bin.remove() }
            let runtime = try TemporaryDirectory()
            defer { runtime.remove() }
            // xdg-open stays (as it does with some browsers) until the test lets it go, so its
            // arguments are in /proc while the test looks.
            try """
            #!/bin/sh
            printf '%s\\n' "$#" "$@" > \(bin.file("argv.tmp")) && mv \(bin.file("argv.tmp")) \(bin.file("argv"))
            while [ -d \(bin.path) ] && [ ! -e \(bin.file("release")) ]; do sleep 0.05; done

            """.write(toFile: bin.file("xdg-open"), atomically: true, encoding: .utf8)
            chmod(bin.file("xdg-open"), 0o755)
            let path = bin.path + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
            let login = try BackgroundBrokerctl(
                broker, ["login", "web", "--json"] + Self.provider(idp),
                environment: ["DISPLAY": ":9", "PATH": path, "XDG_RUNTIME_DIR": runtime.path])
            defer { _ = FileManager.default.createFile(atPath: bin.file("release"), contents: nil) }
            let start = try #require(try await login.jsonEvent("authorization_url")["url"] as? String)
            let argv = try await login.waitFor("xdg-open's arguments") { _ in
                (try? String(contentsOfFile: bin.file("argv"), encoding: .utf8)).map {
                    $0.split(separator: "\n").map(String.init)
                }
            }
            #expect(argv.count == 2 && argv.first == "1", "one argument: \(argv)")
            let opened = try #require(argv.last)

            // The page: a file URL under $XDG_RUNTIME_DIR, 0600 in a 0700 directory, both the user's.
            let page = try #require(URL(string: opened))
            #expect(page.isFileURL && opened.hasPrefix("file://\(runtime.path)/tokenbroker-login-"), "\(opened)")
            var file = stat()
            var directory = stat()
            #expect(lstat(page.path, &file) == 0 && lstat(page.deletingLastPathComponent().path, &directory) == 0)
            #expect(file.st_mode & S_IFMT == S_IFREG && file.st_mode & 0o7777 == 0o600 && file.st_uid == getuid())
            #expect(directory.st_mode & S_IFMT == S_IFDIR && directory.st_mode & 0o7777 == 0o700)
            #expect(directory.st_uid == getuid())

            // The browser follows the page to the start link, and the start link to the IdP.
            let browser = TestBrowser()
            #expect(try browser.follow(pageAt: opened) == start)
            let url = try await browser.start(start)
            let key = try #require(queryValue("k", in: start))
            let secrets = try [url, key] + ["state", "code_challenge"].map { try #require(queryValue($0, in: url)) }
            #expect(!secrets.contains { opened.contains($0) }, "xdg-open's argument holds none of them")

            // Every process's arguments, and the environments this user may read.
            var scanned = (arguments: 0, environments: 0, opener: false)
            var leaks: [String] = []
            let pids = try FileManager.default.contentsOfDirectory(atPath: "/proc").filter { Int($0) != nil }
            for pid in pids {
                for part in ["cmdline", "environ"] {
                    guard let data = try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/\(part)")) else {
                        continue
                    }
                    if part == "cmdline" {
                        scanned.arguments += 1
                        scanned.opener =
                            scanned.opener || (data.contains(bin.file("xdg-open")) && data.contains(opened))
                    } else {
                        scanned.environments += 1
                    }
                    if secrets.contains(where: { data.contains($0) }) { leaks.append("/proc/\(pid)/\(part)") }
                }
            }
            #expect(leaks.isEmpty, "\(leaks)")
            #expect(scanned.opener, "the scan saw xdg-open with the page's URL")
            #expect(scanned.arguments > 10 && scanned.environments > 3, "\(scanned)")

            // Another process with the right state and a code of its own completes nothing.
            let forged = try await TestBrowser.authorize(url)
            let refused = try await TestBrowser.get(forged)
            #expect(refused.status == 403)
            // The login goes on: it ends below with the browser's code, not the forged one.
            #expect(!login.child.hasExited(), "the forged callback does not end the login")
            #expect(try await Self.status(broker, "web") == nil)

            _ = FileManager.default.createFile(atPath: bin.file("release"), contents: nil)
            let location = try await TestBrowser.authorize(url)
            #expect(try await browser.visit(location).status == 200)
            #expect(await login.finish() == 0, "\(login.stderr)")
            #expect(try await Self.status(broker, "web")?["state"] as? String == "valid")
            let exchanged = idp.calls.filter { $0.grantType == "authorization_code" }.map(\.code)
            #expect(exchanged == [queryValue("code", in: location)], "the browser's code, not the forged one")
            #expect(!FileManager.default.fileExists(atPath: page.deletingLastPathComponent().path), "page removed")
        }
    }

    /// SIGTERM during a browser login: exit 143, the page and its directory removed, no account.
    @Test func sigtermRemovesTheSignInPage() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            let bin = try TemporaryDirectory()
            defer { bin.remove() }
            let path = try Self.recordingXDGOpen(in: bin)
            let login = try BackgroundBrokerctl(
                broker, ["login", "gone", "--flow", "browser", "--json"] + Self.provider(idp),
                environment: ["DISPLAY": ":9", "PATH": path])
            let opened = try await login.waitFor("xdg-open's argument") { _ in
                (try? String(contentsOfFile: bin.file("opened"), encoding: .utf8)).flatMap { $0.isEmpty ? nil : $0 }
            }
            let page = try #require(URL(string: opened))
            #expect(FileManager.default.fileExists(atPath: page.path))
            kill(login.child.pid, SIGTERM)
            #expect(await login.finish() == 143)
            #expect(login.jsonLines.last?["code"] as? String == "cancelled")
            #expect(!FileManager.default.fileExists(atPath: page.deletingLastPathComponent().path))
            #expect(try await Self.status(broker, "gone") == nil)
        }
    }

    /// Ctrl-C (SIGINT) in a pipe: exit 130, "cancelled", an error object with `--json`, no account.
    @Test func interruptCancelsTheLogin() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)
            let login = try BackgroundBrokerctl(
                broker, ["login", "gone", "--flow", "device", "--json"] + Self.provider(idp))
            _ = try await login.jsonEvent("device_code")
            kill(login.child.pid, SIGINT)
            #expect(await login.finish() == 130)
            #expect(login.stderr == "brokerctl: cancelled\n")
            #expect(login.jsonLines.last?["code"] as? String == "cancelled")
            #expect(try await Self.status(broker, "gone") == nil)
        }
    }

    /// On a terminal (tmux): the code and URL, a progress line redrawn in place, and Ctrl-C
    /// leaving exit 130, no account, no more polls at the IdP.
    @Test func terminalShowsProgressInPlaceAndCtrlCStopsTheDeviceFlow() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)
            let terminal = try await TmuxTerminal(environment: Self.terminalEnvironment(broker))
            try terminal.run(
                [BrokerProcess.binary("brokerctl").path, "login", "tty", "--flow", "device"] + Self.provider(idp))
            let progress = { (line: String) in line.contains("waiting for you to sign in") }
            let first = try await terminal.waitForScreen("the progress line") { $0.contains(where: progress) }
            #expect(first.contains { $0.contains("enter the code: ") })
            #expect(first.contains { $0.hasPrefix(BackgroundBrokerctl.deviceLinkPrefix) })
            let row = try #require(first.firstIndex(where: progress))
            // brokerctl redraws its countdown every second.
            let second = try await terminal.waitForScreen("the progress line redrawn") { lines in
                lines.firstIndex(where: progress).map { lines[$0] != first[row] } ?? true
            }
            #expect(first.filter(progress).count == 1 && second.filter(progress).count == 1, "one line, redrawn")
            #expect(second.firstIndex(where: progress) == row, "the same line")
            #expect(first[row] != second[row], "updated in place: \(first[row]) / \(second[row])")
            #expect(await eventually { idp.devicePolls.count >= 1 })

            try terminal.press("C-c")
            #expect(await eventually { terminal.exitStatus != nil })
            #expect(terminal.exitStatus == 130)
            let after = try terminal.screen()
            #expect(after.contains("brokerctl: cancelled"))
            #expect(!after.contains(where: progress), "the progress line is cleared")
            // The broker polled every second while the login ran: a pause of three means it stopped.
            #expect(
                await eventually(timeout: 30) {
                    idp.devicePolls.last.map { Date().timeIntervalSince($0) > 3 } ?? true
                }, "the broker stopped polling")
            #expect(try await Self.status(broker, "tty") == nil)
        }
    }

    /// The browser variant: Ctrl-C closes the broker's redirect listener.
    @Test func terminalCtrlCClosesTheRedirectListener() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            let terminal = try await TmuxTerminal(environment: Self.terminalEnvironment(broker))
            let fixedPort = try freePort()
            try terminal.run(
                [
                    BrokerProcess.binary("brokerctl").path, "login", "tty", "--flow", "browser", "--no-browser",
                    "--redirect-port", String(fixedPort),
                ] + Self.provider(idp))
            let screen = try await terminal.waitForScreen("the URL and the progress line") { lines in
                lines.contains { $0.contains("waiting for you to sign in") } && lines.contains { $0.hasPrefix("http") }
            }
            let url = try #require(screen.first { $0.hasPrefix("http") })
            let port = try #require(URLComponents(string: url)?.port)
            #expect(port == fixedPort, "--redirect-port")
            #expect(TestBrowser.isListening(port, in: broker.pid))

            try terminal.press("C-c")
            #expect(await eventually { terminal.exitStatus != nil })
            #expect(terminal.exitStatus == 130)
            #expect(await eventually { !TestBrowser.isListening(port, in: broker.pid) }, "the listener is closed")
            #expect(try await Self.status(broker, "tty") == nil)
        }
    }

    /// The other endings and their exit codes: the user's time runs out (5), the IdP is down
    /// (6), an account that does not exist and no provider to create it (4), a device flow the
    /// IdP does not offer (1); none leaves an account.
    @Test func timeoutsAndFailuresExitWithTheirCodes() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)

            let browser = try BackgroundBrokerctl(
                broker,
                ["login", "late", "--flow", "browser", "--no-browser", "--timeout", "1", "--json"] + Self.provider(idp))
            let url = try #require(try await browser.jsonEvent("authorization_url")["url"] as? String)
            let port = try #require(URLComponents(string: url)?.port)
            #expect(await browser.finish() == 5, "\(browser.stdout)")
            #expect(browser.jsonLines.last?["code"] as? String == "needs_login")
            #expect(!TestBrowser.isListening(port, in: broker.pid))
            let device = try BackgroundBrokerctl(
                broker, ["login", "late", "--flow", "device", "--timeout", "2"] + Self.provider(idp))
            #expect(await device.finish() == 5, "\(device.stderr)")
            #expect(device.stderr.contains("enter the code"))

            let missing = try await broker.brokerctl(["login", "nobody", "--flow", "device"])
            #expect(missing.status == 4)
            #expect(missing.stderr.contains("--issuer"), "\(missing.stderr)")

            let browserOnly = try await OAuth2TestIdP()
            browserOnly.setOffersDeviceEndpoint(false)
            let noDevice = try await broker.brokerctl(
                ["login", "nodevice", "--flow", "device"] + Self.provider(browserOnly))
            #expect(noDevice.status == 1)
            #expect(noDevice.stderr.contains("--flow browser"), "\(noDevice.stderr)")
            await browserOnly.shutdown()

            idp.setBehavior(.status(503, retryAfter: nil))
            let down = try await broker.brokerctl(["login", "down", "--flow", "device"] + Self.provider(idp))
            #expect(down.status == 6, "\(down.stderr)")
            for account in ["late", "nobody", "nodevice", "down"] {
                #expect(try await Self.status(broker, account) == nil)
            }
        }
    }

    /// brokerctl's argv, environment, stdout and stderr during a login hold no refresh token,
    /// access token or client secret (the secret given on stdin, read by the broker).
    @Test func noSecretPassesThroughBrokerctl() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)
            let login = try BackgroundBrokerctl(
                broker,
                ["login", "leak", "--flow", "device", "--client-auth", "client_secret_post", "--secrets", "-"]
                    + Self.provider(idp),
                stdin: #"{"client_secret": "\#(idp.clientSecret)"}"#)
            let link = try await login.deviceLink()
            let pid = login.child.pid
            let argv = try Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))
            let environment = try Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/environ"))
            #expect(try await idp.decide(.approve, at: link) == 200)
            #expect(await login.finish() == 0, "\(login.stderr)")
            #expect(idp.calls.last?.clientSecret == idp.clientSecret, "the broker read the secret and used it")

            let secrets = idp.issuedRefreshTokens + idp.issuedAccessTokens + [idp.clientSecret]
            #expect(secrets.count == 3)
            for secret in secrets {
                // Checked outside #expect, whose failure message would print the secret.
                let places = [
                    argv.contains(secret), environment.contains(secret), login.stdout.contains(secret),
                    login.stderr.contains(secret),
                ]
                #expect(places == [false, false, false, false], "a secret in argv, environment, stdout or stderr")
            }
        }
    }

    /// An account the IdP denied (`invalid_grant`) is restored by `brokerctl login NAME` with its
    /// own settings; `status` names that command while it waits.
    @Test func loginRestoresAnAccountInNeedsLogin() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)
            let added = try await broker.brokerctl(
                ["add", "back", "--kind", "oauth2"] + Self.provider(idp) + ["--secrets", "-"],
                stdin: #"{"refresh_token": "rt-the-idp-forgot"}"#)
            #expect(added.status == 0, "\(added.stderr)")
            #expect(
                try await eventually { try await Self.status(broker, "back")?["state"] as? String == "needs_login" })
            #expect(try await broker.brokerctl(["status"]).stdout.contains("back: sign in with brokerctl login back\n"))
            let before = try #require(try await Self.status(broker, "back"))

            let other = try await broker.brokerctl(
                ["login", "back", "--flow", "device", "--issuer", idp.issuer, "--client-id", "another-client"])
            #expect(other.status == 1)
            #expect(other.stderr.contains("other settings"), "\(other.stderr)")

            let login = try BackgroundBrokerctl(broker, ["login", "back", "--flow", "device"])
            #expect(try await idp.decide(.approve, at: try await login.deviceLink()) == 200)
            #expect(await login.finish() == 0, "\(login.stderr)")
            let after = try #require(try await Self.status(broker, "back"))
            #expect(after["state"] as? String == "valid")
            #expect(after["provider"] as? String == before["provider"] as? String)
            #expect(!(try await broker.brokerctl(["status"]).stdout.contains("brokerctl login")))

            let loginRefreshToken = try #require(idp.issuedRefreshTokens.last)
            #expect(try await broker.brokerctl(["refresh", "back"]).status == 0)
            #expect(idp.calls.last { $0.grantType == "refresh_token" }?.refreshToken == loginRefreshToken)

            // A non-oauth2 account that lost its tokens is restored with set-tokens instead.
            _ = try await broker.brokerctl(
                ["add", "fixed", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"t","expires_in":600}"#
            )
            #expect(try await broker.brokerctl(["logout", "fixed"]).status == 0)
            #expect(
                try await broker.brokerctl(["status"]).stdout.contains(
                    "fixed: push a new access_token with brokerctl set-tokens fixed (op set_tokens)"))
        }
    }

    /// `brokerctl token NAME --id-token` prints the id token of the login; exit 4 for an account
    /// whose IdP issued none.
    @Test func idTokenIsPrintedOrNotFound() async throws {
        try await Self.withBrokerAndIdP { broker, idp in
            idp.setDeviceTiming(interval: 1)
            let login = try BackgroundBrokerctl(broker, ["login", "oidc", "--flow", "device"] + Self.provider(idp))
            #expect(try await idp.decide(.approve, at: try await login.deviceLink()) == 200)
            #expect(await login.finish() == 0, "\(login.stderr)")
            let idToken = try #require(idp.issuedIDTokens.last)
            for arguments in [["token", "oidc", "--id-token"], ["token", "--id-token", "oidc"]] {
                let printed = try await broker.brokerctl(arguments)
                #expect(printed.status == 0, "\(printed.stderr)")
                #expect(printed.stdout == idToken + "\n")
            }
            #expect(
                try await broker.brokerctl(["token", "oidc"]).stdout == idp.issuedAccessTokens.last.map { $0 + "\n" })

            let plain = try BackgroundBrokerctl(
                broker, ["login", "plain", "--flow", "device"] + Self.provider(idp, scope: "offline_access"))
            #expect(try await idp.decide(.approve, at: try await plain.deviceLink()) == 200)
            #expect(await plain.finish() == 0, "\(plain.stderr)")
            let none = try await broker.brokerctl(["token", "plain", "--id-token"])
            #expect(none.status == 4)
            #expect(none.stdout.isEmpty)
            #expect(none.stderr.contains("no id token"), "\(none.stderr)")
        }
    }

    /// The broker's environment for a terminal: no display, no SSH session, its socket.
    static func terminalEnvironment(_ broker: BrokerProcess) -> [String: String] {
        var environment = broker.environment
        for name in ["DISPLAY", "WAYLAND_DISPLAY", "SSH_CONNECTION", "TMUX"] { environment[name] = nil }
        environment["TOKENBROKER_SOCKET"] = broker.socketPath
        environment["TERM"] = "xterm"
        return environment
    }
}
