import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// `brokerctl git-credential` driven by the real git: `git credential fill`, and clones and
/// fetches over HTTP from a server that requires a token the IdP issued (and refuses it once, or
/// once it has expired).
@Suite struct GitCredentialTests {
    /// A git configuration of its own (no system or user file, `file` in the broker's home), with
    /// `helpers` in order.
    private func gitEnvironment(
        _ bridge: BridgeBroker, helpers: [String], path: String? = nil, file: String = "gitconfig"
    ) throws -> [String: String] {
        let home = bridge.broker.root.appendingPathComponent("home").path
        let config = home + "/" + file
        try (helpers.map { "[credential]\n\thelper = \"\($0)\"\n" }.joined()).write(
            toFile: config, atomically: true, encoding: .utf8)
        var environment = [
            "GIT_CONFIG_GLOBAL": config, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "",
            "SSH_ASKPASS": "",
        ]
        if let path {
            environment["PATH"] = path + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        }
        return environment
    }

    /// `key=value` lines as pairs, in order.
    private func pairs(_ text: String) -> [(String, String)] {
        text.split(separator: "\n").map { line in
            let parts = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            return (String(parts[0]), parts.count > 1 ? String(parts[1]) : "")
        }
    }

    /// Whether the git that printed `version` (`git version 2.39.5`) reads `password_expiry_utc`,
    /// which git 2.40 brought.
    private func knowsExpiry(_ version: String) throws -> Bool {
        let word = try #require(version.split(whereSeparator: \.isWhitespace).last)
        return !word.split(separator: ".").compactMap { Int($0) }.lexicographicallyPrecedes([2, 40])
    }

    @Test func gitCredentialFillGetsTheTokenAndTheHelperItsExpiry() async throws {
        let bridge = try await BridgeBroker.start { _ in
            """
            [accounts.api.git]
            hosts = ["git.example:8443", "GitHub.com"]

            [accounts.hidden]
            kind = "static"
            [accounts.hidden.access]
            executables = ["/usr/bin/false"]
            [accounts.hidden.git]
            hosts = ["hidden.example"]
            """
        }
        let brokerctl = BrokerProcess.binary("brokerctl").path
        // The helper as git runs it, behind a tee that keeps the answer git read.
        let answerFile = bridge.broker.root.appendingPathComponent("answer").path
        let git = try gitEnvironment(
            bridge, helpers: ["!f() { '\(brokerctl)' git-credential $1 | tee '\(answerFile)'; }; f"])

        let fill = try await bridge.run(
            ["credential", "fill"], program: "git", stdin: "protocol=https\nhost=git.example:8443\n\n", environment: git
        )
        #expect(fill.status == 0, "\(fill.stderr)")
        let token = try #require(bridge.lastIssued)
        let json = try await bridge.run(["token", "api", "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        let expected = try #require(
            (object?["expires_at"] as? String).flatMap(Wire.parseRFC3339)?.timeIntervalSince1970)
        let expiry = String(Int(expected.rounded(.down)))
        let answer = pairs(try String(contentsOfFile: answerFile, encoding: .utf8))
        #expect(answer.map(\.0) == ["username", "password", "password_expiry_utc"])
        #expect(answer.map(\.1) == ["oauth2", token, expiry])
        // git took the answer: its own output has the password, and the expiry only where git
        // knows the attribute (2.40+; Debian 12's 2.39 drops the line, as docs/bridges.md says).
        let filled = Dictionary(pairs(fill.stdout), uniquingKeysWith: { $1 })
        #expect(filled["username"] == "oauth2")
        #expect(filled["password"] == token)
        #expect(filled["host"] == "git.example:8443")
        let version = try await bridge.run(["--version"], program: "git")
        #expect(filled["password_expiry_utc"] == (try knowsExpiry(version.stdout) ? expiry : nil), "\(version.stdout)")

        // git 2.46+ offers capability[]=authtype: a Bearer credential instead of a password.
        let bearer = try await bridge.run(
            ["git-credential", "get"], stdin: "capability[]=authtype\nprotocol=https\nhost=git.example:8443\n\n")
        #expect(bearer.status == 0, "\(bearer.stderr)")
        let bearerAnswer = pairs(bearer.stdout)
        #expect(
            bearerAnswer.map(\.0) == ["capability[]", "authtype", "credential", "ephemeral", "password_expiry_utc"])
        #expect(bearerAnswer.map(\.1).prefix(4) == ["authtype", "Bearer", token, "1"])

        // A host, a protocol or a user no account serves: an empty answer, exit 0, and git goes
        // on to its next helper.
        for input in [
            "protocol=https\nhost=other.example\n", "protocol=ssh\nhost=github.com\n",
            "protocol=https\nhost=github.com\nusername=someone\n", "protocol=https\nhost=git.example\n",
            // Served by an account brokerctl may not use: status does not show it to brokerctl.
            "protocol=https\nhost=hidden.example\n",
        ] {
            let none = try await bridge.run(["git-credential", "get"], stdin: input + "\n")
            #expect(none.status == 0 && none.stdout.isEmpty, "\(input): \(none.stderr)")
        }
        let status = try await bridge.run(["status", "--json"])
        let listed = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
        let accounts = try #require(listed?["accounts"] as? [[String: Any]])
        #expect(accounts.map { $0["account"] as? String } == ["api"])
        let gitBridge = try #require(accounts.first?["git"] as? [String: Any])
        #expect(Set(gitBridge.keys) == ["hosts", "username"])
        #expect(gitBridge["hosts"] as? [String] == ["git.example:8443", "github.com"])
        #expect(gitBridge["username"] as? String == "oauth2")
        let chained = try gitEnvironment(
            bridge, helpers: ["!\(brokerctl) git-credential", "!f() { echo username=next; echo password=pw-next; }; f"])
        let next = try await bridge.run(
            ["credential", "fill"], program: "git", stdin: "protocol=https\nhost=other.example\n\n",
            environment: chained)
        #expect(next.status == 0, "\(next.stderr)")
        #expect(Dictionary(pairs(next.stdout), uniquingKeysWith: { $1 })["password"] == "pw-next")

        // store keeps nothing; a control character or an oversized description is refused.
        let store = try await bridge.run(
            ["git-credential", "store"], stdin: "protocol=https\nhost=github.com\nusername=oauth2\npassword=x\n\n")
        #expect(store.status == 0 && store.stdout.isEmpty)
        let control = try await bridge.run(
            ["git-credential", "get"], stdin: "protocol=https\nhost=github.com\u{1B}[2J\n\n")
        #expect(control.status == 1 && control.stdout.isEmpty)
        let huge = try await bridge.run(
            ["git-credential", "get"],
            stdin: String(repeating: "path=\(String(repeating: "a", count: 1000))\n", count: 300))
        #expect(huge.status == 1 && huge.stdout.isEmpty)
        #expect(bridge.idp.callCount == 1, "every answer came from the one token")

        // erase of a password the broker did not give changes nothing; of its token, refreshes once.
        let erase = "protocol=https\nhost=github.com\nusername=oauth2\npassword="
        let foreign = try await bridge.run(["git-credential", "erase"], stdin: erase + "someone-elses\n\n")
        #expect(foreign.status == 0 && foreign.stdout.isEmpty && bridge.idp.callCount == 1)
        let own = try await bridge.run(["git-credential", "erase"], stdin: erase + token + "\n\n")
        #expect(own.status == 0 && own.stdout.isEmpty && bridge.idp.callCount == 2, "\(own.stderr)")
        let again = try await bridge.run(["git-credential", "get"], stdin: "protocol=https\nhost=github.com\n\n")
        #expect(pairs(again.stdout).dropFirst().first?.1 == bridge.lastIssued && bridge.lastIssued != token)
        _ = try await bridge.run(["git-credential", "erase"], stdin: erase + token + "\n\n")
        #expect(bridge.idp.callCount == 2, "an old token erased again makes no refresh")

        // A broker that is not running: a message, and a failure git reports and passes over.
        await bridge.stop()
        let down = try await bridge.run(["git-credential", "get"], stdin: "protocol=https\nhost=github.com\n\n")
        #expect(down.status == 3 && down.stdout.isEmpty && down.stderr.contains("brokerctl:"))
        bridge.expectNoSecretInOutputs()
    }

    /// A bearer token crosses plain http only to a loopback host or one listed in `allow_http`:
    /// real git asking for an `http://` URL of another host gets no password, and a warning.
    @Test func plainHTTPGetsTheTokenOnlyOnLoopbackOrWhereAllowed() async throws {
        let bridge = try await BridgeBroker.start { _ in
            """
            [accounts.api.git]
            hosts = ["git.example", "intranet.example:8080", "localhost:8080", "127.0.0.1:3000", "[::1]:8080"]
            allow_http = ["intranet.example:8080"]
            """
        }
        let brokerctl = BrokerProcess.binary("brokerctl").path
        let git = try gitEnvironment(bridge, helpers: ["!\(brokerctl) git-credential"])
        let fill = { (input: String) in
            try await bridge.run(["credential", "fill"], program: "git", stdin: input + "\n", environment: git)
        }

        let refused = try await fill("protocol=http\nhost=git.example")
        #expect(!refused.stdout.contains("password="), "no token over plain http")
        let warnings = refused.stderr.split(separator: "\n").filter { $0.hasPrefix("brokerctl:") }
        #expect(warnings.count == 1 && warnings.first?.contains("http://git.example") == true, "\(refused.stderr)")
        // The helper alone: an empty answer, exit 0 (git goes on to its next helper), one warning line.
        let direct = try await bridge.run(["git-credential", "get"], stdin: "protocol=http\nhost=git.example\n\n")
        #expect(direct.status == 0 && direct.stdout.isEmpty)
        #expect(direct.stderr.hasPrefix("brokerctl: ") && direct.stderr.filter { $0 == "\n" }.count == 1)

        let token = try #require(bridge.lastIssued)
        for input in [
            "protocol=https\nhost=git.example", "protocol=http\nhost=localhost:8080",
            "protocol=http\nhost=127.0.0.1:3000",
            "protocol=http\nhost=[::1]:8080", "protocol=http\nhost=intranet.example:8080",
        ] {
            let served = try await fill(input)
            #expect(served.status == 0, "\(input): \(served.stderr)")
            #expect(Dictionary(pairs(served.stdout), uniquingKeysWith: { $1 })["password"] == token, "\(input)")
            #expect(!served.stderr.contains("brokerctl:"), "\(input): \(served.stderr)")
        }
        await bridge.stop()
        bridge.expectNoSecretInOutputs()
    }

    @Test func aRefusedTokenIsErasedAndTheNextCloneRefreshesOnce() async throws {
        let work = try TemporaryDirectory()
        defer { work.remove() }
        let repositories = try servedRepository(in: work, content: "served-by-test\n")

        let issued = SharedValue<OAuth2TestIdP?>(nil)
        let server = try await GitHTTPServer(root: repositories) { password in
            issued.value?.issuedAccessTokens.last == password
        }
        let bridge = try await BridgeBroker.start { _ in
            """
            [accounts.api.git]
            hosts = ["127.0.0.1:\(server.port)"]
            username = "x-access-token"
            """
        }
        issued.value = bridge.idp
        // Installed as scripts/run and scripts/install-user-service link it: credential.helper = tokenbroker.
        let bin = try bridge.helperDirectory(named: ["git-credential-tokenbroker"])
        let git = try gitEnvironment(bridge, helpers: ["tokenbroker"], path: bin)
        let first = try #require(try await bridge.run(["token", "api"]).stdout.split(separator: "\n").first)
        #expect(bridge.idp.callCount == 1)

        let url = "http://127.0.0.1:\(server.port)/repo.git"
        let refused = try await bridge.run(["clone", "-q", url, work.path + "/one"], program: "git", environment: git)
        #expect(refused.status != 0, "the server refused the token once")
        #expect(bridge.idp.callCount == 2, "git erased the refused token: exactly one refresh")

        let cloned = try await bridge.run(["clone", "-q", url, work.path + "/two"], program: "git", environment: git)
        #expect(cloned.status == 0, "\(cloned.stderr)")
        let readme = try String(contentsOfFile: work.file("two/README"), encoding: .utf8)
        #expect(readme == "served-by-test\n")
        #expect(bridge.idp.callCount == 2, "the fresh token served the clone; no other refresh")
        let attempts = server.attempts
        #expect(attempts.first?.password == String(first) && attempts.first?.status == 401)
        #expect(attempts.dropFirst().allSatisfy { $0.password == bridge.lastIssued && $0.status == 200 })
        #expect(attempts.allSatisfy { $0.username == "x-access-token" })
        #expect(attempts.count > 1)
        await server.shutdown()
        await bridge.stop()
        bridge.expectNoSecretInOutputs()
    }

    /// Tokens live 5 s here. A fetch after the first one expired gets a fresh token from the helper,
    /// with no prompt. A credential-store in front of the helper keeps no expiry (in any git
    /// version): it hands git the expired token, that command fails and git erases it, and the
    /// next command works (docs/bridges.md).
    @Test func aFetchAfterTheTokenExpiredGetsAFreshOneWithoutAPrompt() async throws {
        let work = try TemporaryDirectory()
        defer { work.remove() }
        let repositories = try servedRepository(in: work, content: "fresh\n")
        let issued = SharedValue<OAuth2TestIdP?>(nil)
        let server = try await GitHTTPServer(root: repositories, refusesFirst: false) { password in
            issued.value?.accepted(password, at: Date(), grace: 0) == true
        }
        let bridge = try await BridgeBroker.start(lifetime: 5) { _ in
            """
            [accounts.api.git]
            hosts = ["127.0.0.1:\(server.port)"]

            [broker]
            default_min_ttl = 1
            """
        }
        issued.value = bridge.idp
        let bin = try bridge.helperDirectory(named: ["git-credential-tokenbroker"])
        let alone = try gitEnvironment(bridge, helpers: ["tokenbroker"], path: bin)
        let storeFile = work.file("git-credentials")
        let stored = try gitEnvironment(
            bridge, helpers: ["store --file=\(storeFile)", "tokenbroker"], path: bin, file: "stored.gitconfig")
        let url = "http://127.0.0.1:\(server.port)/repo.git"
        let git = { (arguments: [String], environment: [String: String]) in
            try await bridge.run(arguments, program: "git", environment: environment)
        }

        let cloned = try await git(["clone", "-q", url, work.file("clone")], alone)
        #expect(cloned.status == 0, "\(cloned.stderr)")
        let listed = try await git(["ls-remote", url], stored)
        #expect(listed.status == 0, "\(listed.stderr)")
        let used = server.attempts.filter { $0.status == 200 }.compactMap(\.password)
        let kept = try #require(used.last)
        #expect(try String(contentsOfFile: storeFile, encoding: .utf8).contains(kept), "the store kept the token")

        #expect(
            await eventually(timeout: 30) { used.allSatisfy { !bridge.idp.accepted($0, at: Date(), grace: 0) } },
            "every token used has expired")
        let before = server.attempts.count
        let fetched = try await git(["-C", work.file("clone"), "fetch", "-q"], alone)
        #expect(fetched.status == 0, "\(fetched.stderr)")
        let fetch = server.attempts.dropFirst(before)
        #expect(!fetch.isEmpty && fetch.allSatisfy { $0.status == 200 && !used.contains($0.password ?? "") })

        // The store in front: its expired token fails this command (and is erased), not the next.
        let failed = try await git(["ls-remote", url], stored)
        #expect(failed.status != 0 && failed.stderr.contains("Authentication failed"), "\(failed.stderr)")
        #expect(server.attempts.last.map { $0.password == kept && $0.status == 401 } == true)
        #expect(try String(contentsOfFile: storeFile, encoding: .utf8).contains(kept) == false)
        let again = try await git(["ls-remote", url], stored)
        #expect(again.status == 0, "\(again.stderr)")
        await server.shutdown()
        await bridge.stop()
        bridge.expectNoSecretInOutputs()
    }
}

/// A value shared with a closure that runs on another thread.
final class SharedValue<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}
