import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// brokerctl as scripts use it: tokens on stdout only, secrets from stdin, distinct exit codes.
@Suite struct BrokerctlTests {
    @Test func scriptsGetTokensAndDistinctExitCodes() async throws {
        let broker = try BrokerProcess()
        let notRunning = try await broker.brokerctl(["token", "api"])
        #expect(notRunning.status == 3)
        #expect(notRunning.stderr.contains("not running"))

        try await broker.start()
        defer { broker.stop() }
        let added = try await broker.brokerctl(
            ["add", "api", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"tok-123","expires_in":600}"#
        )
        #expect(added.status == 0, "\(added.stderr)")

        let token = try await broker.brokerctl(["token", "api"])
        #expect(token.status == 0)
        #expect(token.stdout == "tok-123\n")

        let json = try await broker.brokerctl(["token", "api", "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        #expect(object?["access_token"] as? String == "tok-123")

        #expect(try await broker.brokerctl(["token", "nobody"]).status == 4)
        // Valid for 600 s, so a min_ttl of an hour cannot be met by a static account.
        #expect(try await broker.brokerctl(["token", "api", "--min-ttl", "3600"]).status == 5)

        let status = try await broker.brokerctl(["status"])
        #expect(status.status == 0)
        #expect(status.stdout.contains("api") && status.stdout.contains("valid"))
        #expect(!status.stdout.contains("tok-123"))

        let replaced = try await broker.brokerctl(
            ["set-tokens", "api"], stdin: #"{"access_token":"tok-456","expires_in":600}"#)
        #expect(replaced.status == 0)
        #expect(try await broker.brokerctl(["token", "api"]).stdout == "tok-456\n")

        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-ctl", lifetime: 3600)
        idp.setBehavior(.status(503, retryAfter: 30))
        let oauth = try await broker.brokerctl(
            [
                "add", "flaky", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id", idp.clientID,
                "--client-auth", "client_secret_post", "--secrets", "-",
            ],
            stdin: #"{"refresh_token":"rt-ctl","client_secret":"\#(idp.clientSecret)"}"#)
        #expect(oauth.status == 0, "\(oauth.stderr)")
        #expect(await eventually { idp.callCount >= 1 })
        #expect(try await broker.brokerctl(["token", "flaky"]).status == 6)
        #expect(try await broker.brokerctl(["refresh", "flaky"]).status == 6)
        idp.setBehavior(.normal)
        let refreshed = try await broker.brokerctl(["refresh", "flaky"])
        #expect(refreshed.status == 0, "\(refreshed.stderr)")
        #expect(try await broker.brokerctl(["token", "flaky"]).stdout == idp.issuedAccessTokens.last.map { $0 + "\n" })
        #expect(idp.calls.last?.clientSecret == idp.clientSecret)

        #expect(try await broker.brokerctl(["remove", "api"]).status == 0)
        #expect(try await broker.brokerctl(["token", "api"]).status == 4)
        await idp.shutdown()
    }

    /// `brokerctl logout`: refused with "unavailable" while the IdP is down, forced with --force,
    /// `brokerctl token` in its plain forms takes a short path past ArgumentParser; every form,
    /// plain or not, gets the same output, error text and exit code.
    /// A typo gets the nearest command or account; a usage error exits 64, which `--help` lists;
    /// both programs print their version.
    @Test func typosGetADidYouMeanAndUsageErrorsADocumentedCode() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let added = try await broker.brokerctl(
            ["add", "dot", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"tok-dot","expires_in":600}"#
        )
        #expect(added.status == 0, "\(added.stderr)")

        let command = try await broker.brokerctl(["tokn", "dot"])
        #expect(command.status == 64 && command.stderr.contains(#"did you mean "token"?"#), "\(command.stderr)")
        let unrelated = try await broker.brokerctl(["frobnicate"])
        #expect(unrelated.status == 64 && !unrelated.stderr.contains("did you mean"), "\(unrelated.stderr)")
        let help = try await broker.brokerctl(["--help"])
        #expect(help.stdout.contains("64 usage error"), "\(help.stdout)")

        // On both paths of `token` (the short one, and ArgumentParser's for --json).
        for arguments in [["token", "dto"], ["token", "dto", "--json"]] {
            let account = try await broker.brokerctl(arguments)
            #expect(account.status == 4 && account.stderr.contains(#"did you mean "dot"?"#), "\(account.stderr)")
        }
        let far = try await broker.brokerctl(["token", "elsewhere"])
        #expect(far.status == 4 && !far.stderr.contains("did you mean"), "\(far.stderr)")

        for program in ["brokerd", "brokerctl"] {
            let (status, output) = try await ChildProcess.run(
                BrokerProcess.binary(program).path, ["--version"], environment: broker.environment)
            #expect(status == 0 && output.trimmingCharacters(in: .whitespacesAndNewlines) == Release.version)
        }
    }

    @Test func tokenAnswersAlikeOnEitherPath() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let added = try await broker.brokerctl(
            ["add", "api", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"tok-123","expires_in":600}"#
        )
        #expect(added.status == 0, "\(added.stderr)")
        let socket = broker.socketPath
        // Each pair: a plain form (short path) and a form only ArgumentParser reads.
        let pairs: [([String], [String])] = [
            (["token", "api"], ["token", "--", "api"]),
            (["token", "api", "--min-ttl", "60"], ["token", "api", "--min-ttl=60"]),
            (["token", "--min-ttl", "0.5", "api"], ["token", "api", "--min-ttl", "5e-1"]),
            (["token", "api", "--min-ttl", "3600"], ["token", "--min-ttl=3600", "api"]),
            (["token", "nobody"], ["token", "--", "nobody"]),
            (["token", "api", "--socket", socket], ["token", "api", "--socket=\(socket)"]),
            (["token", "api", "--socket", socket + ".none"], ["token", "api", "--socket=\(socket).none"]),
            (["token", "api", "--timeout", "0"], ["token", "api", "--timeout=0"]),
        ]
        for (plain, parsed) in pairs {
            let short = try await broker.brokerctl(plain)
            let full = try await broker.brokerctl(parsed)
            #expect(short.status == full.status, "\(plain) vs \(parsed)")
            #expect(short.stdout == full.stdout, "\(plain) vs \(parsed)")
            #expect(short.stderr == full.stderr, "\(plain) vs \(parsed)")
        }
        #expect(try await broker.brokerctl(["token", "api"]).stdout == "tok-123\n")
        #expect(try await broker.brokerctl(["token", "api", "--min-ttl", "3600"]).status == 5)
        #expect(try await broker.brokerctl(["token", "api", "--timeout", "0"]).status != 0)
    }

    /// revoked at the IdP when it is up; the account then answers "needs login" until set-tokens.
    @Test func logoutRevokesOrIsRefusedUntilForced() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-out", lifetime: 3600)
        for name in ["up", "down"] {
            let added = try await broker.brokerctl(
                [
                    "add", name, "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id", idp.clientID,
                    "--revocation-endpoint", idp.revocationEndpoint, "--secrets", "-",
                ],
                stdin: #"{"refresh_token":"rt-out","access_token":"at-\#(name)","expires_in":3600}"#)
            #expect(added.status == 0, "\(added.stderr)")
        }

        idp.setBehavior(.status(503, retryAfter: nil))
        let refused = try await broker.brokerctl(["logout", "down"])
        #expect(refused.status == 6)
        #expect(refused.stderr.contains("--force"))
        #expect(try await broker.brokerctl(["token", "down"]).stdout == "at-down\n", "nothing discarded")
        let forced = try await broker.brokerctl(["logout", "down", "--force"])
        #expect(forced.status == 0)
        #expect(forced.stdout.contains("not revoked"))

        idp.setBehavior(.normal)
        let revoked = try await broker.brokerctl(["logout", "up", "--json"])
        #expect(revoked.status == 0, "\(revoked.stderr)")
        let object = try JSONSerialization.jsonObject(with: Data(revoked.stdout.utf8)) as? [String: Any]
        #expect(object?["revoked"] as? Bool == true)
        #expect(idp.revocations.last?.token == "rt-out")

        #expect(try await broker.brokerctl(["token", "up"]).status == 5)
        #expect(try await broker.brokerctl(["status", "up"]).stdout.contains("logged out"))
        #expect(try await broker.brokerctl(["logout", "nobody"]).status == 4)
        #expect(!broker.log.contains("rt-out"), "no refresh token in the log")
        await idp.shutdown()
    }

    /// brokerctl is one static executable: no program interpreter (`PT_INTERP`) and no shared
    /// library (`DT_NEEDED`), so no dynamic loader runs before `brokerctl token` does its work.
    @Test func brokerctlStartsWithoutTheDynamicLoader() throws {
        let elf = try Data(contentsOf: BrokerProcess.binary("brokerctl"))
        func integer(at offset: Int, size: Int) -> Int {
            (0..<size).reduce(0) { $0 | Int(elf[offset + $1]) << (8 * $1) }
        }
        try #require(elf.count > 64 && elf.prefix(4) == Data([0x7F, 0x45, 0x4C, 0x46]), "an ELF file")
        let (tableOffset, entrySize, entries) = (
            integer(at: 32, size: 8), integer(at: 54, size: 2), integer(at: 56, size: 2)
        )
        let types = (0..<entries).map { integer(at: tableOffset + $0 * entrySize, size: 4) }
        let (loadable, interpreter, dynamic) = (1, 3, 2)
        #expect(types.contains(loadable))
        #expect(!types.contains(interpreter), "brokerctl names a dynamic loader")
        #expect(!types.contains(dynamic), "brokerctl has a dynamic section, so shared libraries")
    }
}
