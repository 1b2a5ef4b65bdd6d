import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Each exit code of brokerctl's table (docs/commands.md, "Common options and exit codes"),
/// from the real brokerctl against a real brokerd: the code, and the one line on stderr that
/// says why.
@Suite struct ExitCodeTests {
    typealias Run = (status: Int32, stdout: String, stderr: String)

    /// `run` exited with `code`, and stderr is the one line `line`.
    static func expect(
        _ run: Run, exits code: Int32, saying line: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(run.status == code, "\(run.stderr)", sourceLocation: sourceLocation)
        #expect(run.stderr == line + "\n", sourceLocation: sourceLocation)
    }

    /// A running broker with the static account `api`, whose token lasts 600 s.
    static func brokerWithStaticAccount() async throws -> BrokerProcess {
        let broker = try BrokerProcess()
        try await broker.start()
        let added = try await broker.brokerctl(
            ["add", "api", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"at-api","expires_in":600}"#)
        #expect(added.status == 0, "\(added.stderr)")
        return broker
    }

    /// A running broker with the oauth2 account `api` of `idp` (made with the refresh token
    /// `rt-exit`), and `settings` as its broker.toml when given.
    static func broker(with idp: OAuth2TestIdP, settings: String? = nil) async throws -> BrokerProcess {
        let broker = try BrokerProcess()
        if let settings { try broker.writeConfig(settings) }
        try await broker.start()
        let added = try await broker.brokerctl(
            [
                "add", "api", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id", idp.clientID,
                "--client-auth", "client_secret_post", "--secrets", "-",
            ],
            stdin: #"{"refresh_token":"rt-exit","client_secret":"\#(idp.clientSecret)"}"#)
        #expect(added.status == 0, "\(added.stderr)")
        return broker
    }

    @Test func zeroIsATokenPrinted() async throws {
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        let token = try await broker.brokerctl(["token", "api"])
        #expect(token.status == 0 && token.stderr.isEmpty, "\(token.stderr)")
        #expect(token.stdout == "at-api\n")
    }

    @Test func oneIsAnotherRefusal() async throws {
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        let added = try await broker.brokerctl(["add", "odd", "--kind", "nonsense", "--allow-empty"])
        Self.expect(
            added, exits: 1,
            saying:
                #"brokerctl: unknown provider kind "nonsense"; use oauth2, refresh_url, sliding, exec, file or static"#)
    }

    @Test func threeIsNoBrokerAtTheSocket() async throws {
        let broker = try BrokerProcess()
        let token = try await broker.brokerctl(["token", "api"])
        Self.expect(
            token, exits: 3,
            saying: "brokerctl: the broker is not running at \(broker.socketPath) (No such file or directory); "
                + "start it with brokerd")
    }

    @Test func fourIsNoSuchAccount() async throws {
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        Self.expect(
            try await broker.brokerctl(["token", "nobody"]), exits: 4,
            saying: "brokerctl: no account named nobody; list them with brokerctl status")
    }

    /// `status` takes several names: those that exist are shown, the others told, exit 4.
    @Test func fourIsAStatusOfAnUnknownAccount() async throws {
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        let other = try await broker.brokerctl(
            ["add", "web", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"at-web","expires_in":600}"#)
        #expect(other.status == 0, "\(other.stderr)")
        let both = try await broker.brokerctl(["status", "api", "web"])
        #expect(both.status == 0 && both.stderr.isEmpty, "\(both.stderr)")
        #expect(both.stdout.contains("api ") && both.stdout.contains("web "))
        let some = try await broker.brokerctl(["status", "web", "nobody", "ghost", "--json"])
        Self.expect(
            some, exits: 4, saying: #"brokerctl: no account named "nobody", "ghost"; list them with brokerctl status"#)
        let shown = try JSONSerialization.jsonObject(with: Data(some.stdout.utf8)) as? [String: Any]
        let names = (shown?["accounts"] as? [[String: Any]])?.compactMap { $0["account"] as? String }
        #expect(names == ["web"])
    }

    @Test func fiveIsAnAccountWithoutAToken() async throws {
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        Self.expect(
            try await broker.brokerctl(["token", "api", "--min-ttl", "3600"]), exits: 5,
            saying: "brokerctl: api is a static account with no token valid long enough; push one with "
                + "brokerctl set-tokens api (op set_tokens)")
    }

    /// `add` of an account that cannot serve creates it, says what to run next and exits 5,
    /// unless `--allow-empty`.
    @Test func fiveIsAnAddedAccountThatCannotServe() async throws {
        let idp = try await OAuth2TestIdP()
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        let empty = try await broker.brokerctl(["add", "o4", "--kind", "static"])
        Self.expect(
            empty, exits: 5,
            saying: "brokerctl: o4 was added but has no token to serve yet; push tokens with brokerctl set-tokens o4 "
                + "(add --allow-empty to exit 0 for such an account)")
        #expect(empty.stdout == "added o4 (needs_login)\n")
        #expect(try await broker.brokerctl(["status", "o4"]).status == 0, "the account was created")
        let signsIn = try await broker.brokerctl([
            "add", "o5", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--device-authorization-endpoint",
            idp.deviceAuthorizationEndpoint, "--client-id", idp.clientID,
        ])
        Self.expect(
            signsIn, exits: 5,
            saying: "brokerctl: o5 was added but has no token to serve yet; sign in with brokerctl login o5 "
                + "(add --allow-empty to exit 0 for such an account)")
        let allowed = try await broker.brokerctl(["add", "o6", "--kind", "static", "--allow-empty"])
        #expect(allowed.status == 0 && allowed.stderr.isEmpty, "\(allowed.stderr)")
        #expect(allowed.stdout == "added o6 (needs_login)\n")
        await idp.shutdown()
    }

    @Test func sixIsAFailingIdP() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-exit")
        // Failing from the start: the account never holds a token `token` could answer with.
        idp.setBehavior(.status(503, retryAfter: 30))
        let broker = try await Self.broker(with: idp)
        defer { broker.stop() }
        let token = try await broker.brokerctl(["token", "api"])
        #expect(token.status == 6, "\(token.stderr)")
        let unavailable =
            #/brokerctl: the token endpoint answered HTTP 503 \(temporarily_unavailable\); the broker retries on its own \(brokerctl status shows how it goes\) \(retry in [0-9]+ s\)\n/#
        #expect(token.stderr.wholeMatch(of: unavailable) != nil, "\(token.stderr)")
        await idp.shutdown()
    }

    @Test func sevenIsAProgramTheAccessRuleRefuses() async throws {
        let broker = try BrokerProcess()
        try broker.writeConfig(
            "[accounts.api]\nkind = \"static\"\n\n[accounts.api.access]\nexecutables = [\"/nonexistent/tool\"]\n")
        try await broker.start()
        defer { broker.stop() }
        Self.expect(
            try await broker.brokerctl(["token", "api"]), exits: 7,
            saying: #"brokerctl: this program may not use the account "api""#)
    }

    @Test func eightIsALockedBroker() async throws {
        let broker = try BrokerProcess()
        try await broker.start(arguments: ["--passphrase"])
        defer { broker.stop() }
        Self.expect(
            try await broker.brokerctl(["token", "api"]), exits: 8,
            saying: "brokerctl: the broker is locked; run brokerctl unlock"
        )
    }

    /// A `--min-ttl` longer than the IdP's tokens last: 9 with the lifetime, on the short path
    /// and through ArgumentParser alike, before a refresh and after one; `--best-effort` serves
    /// the token with a warning.
    @Test func nineIsAMinTTLTheIdPNeverGrants() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-exit", lifetime: 120)
        let broker = try await Self.broker(with: idp)
        defer { broker.stop() }
        let refusal =
            "brokerctl: the IdP issues tokens valid for 120 s, less than min_ttl 300 s; ask for less with --min-ttl"
        // The first refreshes; the next find the token held not yet due.
        for arguments in [["--min-ttl", "300"], ["--min-ttl", "300"], ["--min-ttl", "300", "--json"]] {
            Self.expect(try await broker.brokerctl(["token", "api"] + arguments), exits: 9, saying: refusal)
        }
        #expect(idp.refreshCalls.count == 1, "a refresh cannot help; the IdP is not asked again")
        let best = try await broker.brokerctl(["token", "api", "--min-ttl", "300", "--best-effort"])
        #expect(best.status == 0, "\(best.stderr)")
        let served = idp.issuedAccessTokens.last.map { best.stdout == $0 + "\n" } ?? false
        #expect(served, "the token the IdP issued")
        // What is left of the 120 s the IdP granted (less on a loaded machine).
        let warning = #/brokerctl: warning: this token is valid for ([0-9]+) s only: (.*)\n/#
        let said = try #require(best.stderr.wholeMatch(of: warning), "\(best.stderr)")
        #expect(Int(said.1).map { (1...120).contains($0) } == true, "\(best.stderr)")
        #expect("brokerctl: " + said.2 == refusal)
        let header = try await broker.brokerctl(["header", "api", "--min-ttl", "300", "--best-effort"])
        #expect(header.status == 0 && header.stderr.wholeMatch(of: warning) != nil, "\(header.stderr)")
        let bearer = idp.issuedAccessTokens.last.map { header.stdout == "Authorization: Bearer \($0)\n" } ?? false
        #expect(bearer, "the header of the token the IdP issued")
        Self.expect(
            try await broker.brokerctl(["header", "api", "--min-ttl", "300"]), exits: 9, saying: refusal)
        await idp.shutdown()
    }

    @Test func sixtyFourIsAUsageError() async throws {
        let broker = try BrokerProcess()
        let unknown = try await broker.brokerctl(["tokn", "api"])
        Self.expect(
            unknown, exits: 64,
            saying: #"brokerctl: unknown command "tokn"; did you mean "token"? (brokerctl --help lists the commands)"#)
        let option = try await broker.brokerctl(["token", "api", "--bogus"])
        #expect(option.status == 64)
        #expect(option.stderr.hasPrefix("Error: Unknown option '--bogus'\n"), "\(option.stderr)")
    }

    /// Malformed JSON is a data error, with one line and no usage text.
    @Test func sixtyFiveIsMalformedSecrets() async throws {
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        Self.expect(
            try await broker.brokerctl(
                ["add", "new", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"#),
            exits: 65, saying: "brokerctl: --secrets: stdin is not a JSON tokens object")
        Self.expect(
            try await broker.brokerctl(["set-tokens", "api"], stdin: "access_token=x"), exits: 65,
            saying: "brokerctl: --from: stdin is not a JSON tokens object")
        #expect(try await broker.brokerctl(["status", "new"]).status == 4, "nothing was added")
    }

    /// A file that is not there is "no input", with one line and no usage text.
    @Test func sixtySixIsAMissingSecretsFile() async throws {
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        let missing = broker.root.appendingPathComponent("absent.json").path
        Self.expect(
            try await broker.brokerctl(["add", "new", "--kind", "static", "--secrets", missing]), exits: 66,
            saying: "brokerctl: cannot read --secrets \(missing): No such file or directory")
        Self.expect(
            try await broker.brokerctl(["set-tokens", "api", "--from", missing]), exits: 66,
            saying: "brokerctl: cannot read --from \(missing): No such file or directory")
    }

    /// A broker that does not answer within `--timeout` (its IdP hangs) is not one that is
    /// not running: 75, on the short path and through ArgumentParser alike.
    @Test func seventyFiveIsNoAnswerWithinTheTimeout() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-exit")
        // Hung from the start, for longer than the test: the account never holds a token `token`
        // could answer with at once, and its first refresh does not time out (which would make
        // it `unavailable`, 6) while the test runs.
        idp.setBehavior(.hang)
        let broker = try await Self.broker(with: idp, settings: "[broker]\nrequest_timeout = 600\n")
        defer { broker.stop() }
        let line = "brokerctl: the broker did not answer in time; try again, or wait longer with --timeout"
        for arguments in [["refresh", "api"], ["token", "api"], ["token", "api", "--json"]] {
            Self.expect(try await broker.brokerctl(arguments + ["--timeout", "1"]), exits: 75, saying: line)
        }
        await idp.shutdown()
    }

    /// exec's own: a command that cannot run (126), one killed by a signal (128+N), and the
    /// command's own code.
    @Test func execPassesOnItsCommandsEnd() async throws {
        let broker = try await Self.brokerWithStaticAccount()
        defer { broker.stop() }
        let notExecutable = broker.root.appendingPathComponent("plain.txt").path
        try "not a program\n".write(toFile: notExecutable, atomically: true, encoding: .utf8)
        Self.expect(
            try await broker.brokerctl(["exec", "api", "--", notExecutable]), exits: 126,
            saying: "brokerctl: cannot run \(notExecutable): Permission denied")
        let killed = try await broker.brokerctl(["exec", "api", "--", "/bin/sh", "-c", "kill -TERM $$"])
        #expect(killed.status == 128 + SIGTERM && killed.stderr.isEmpty, "\(killed.stderr)")
        let own = try await broker.brokerctl(["exec", "api", "--", "/bin/sh", "-c", "exit 42"])
        #expect(own.status == 42 && own.stderr.isEmpty, "\(own.stderr)")
    }

    /// A `--redirect-port` another program holds (here the test IdP's) is named as such, not
    /// as a socket error.
    @Test func aRedirectPortInUseSaysSo() async throws {
        let idp = try await OAuth2TestIdP()
        let taken = try #require(URLComponents(string: idp.tokenEndpoint)?.port)
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let login = try await broker.brokerctl([
            "login", "web", "--token-endpoint", idp.tokenEndpoint, "--authorization-endpoint",
            idp.authorizationEndpoint, "--client-id", idp.clientID, "--flow", "browser", "--no-browser",
            "--redirect-port", String(taken),
        ])
        Self.expect(
            login, exits: 1,
            saying: "brokerctl: port \(taken) on 127.0.0.1 is in use; pick another --redirect-port or leave it out")
        await idp.shutdown()
    }
}
