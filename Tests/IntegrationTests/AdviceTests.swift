import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Every state that serves no token names a command that works for its account, and running
/// it as printed brings the account back: for each provider kind, and for an oauth2 account
/// each combination of sign-in endpoints (configured, or named by the issuer's discovery
/// document), the account is driven into `needs_login` (or `logged_out`, or failing refreshes),
/// the `advice_command` of `brokerctl status` is run (a sign-in played at the test IdP, the
/// secrets it asks for piped in), and the account serves a token again.
@Suite struct AdviceTests {
    /// An oauth2 account's IdP and how the account names its endpoints.
    struct Endpoints: CustomTestStringConvertible {
        var issuer: Bool
        var browser: Bool
        var device: Bool
        /// The command the advice must be (`NAME` for the account's name).
        var expected: String

        var testDescription: String {
            (issuer ? "issuer" : "token_endpoint") + (browser ? "+browser" : "") + (device ? "+device" : "")
        }
    }

    static let combinations = [
        Endpoints(issuer: false, browser: false, device: false, expected: "brokerctl set-tokens NAME"),
        Endpoints(issuer: false, browser: true, device: false, expected: "brokerctl login NAME --flow browser"),
        Endpoints(issuer: false, browser: false, device: true, expected: "brokerctl login NAME --flow device"),
        Endpoints(issuer: false, browser: true, device: true, expected: "brokerctl login NAME"),
        Endpoints(issuer: true, browser: false, device: false, expected: "brokerctl set-tokens NAME"),
        Endpoints(issuer: true, browser: true, device: false, expected: "brokerctl login NAME --flow browser"),
        Endpoints(issuer: true, browser: false, device: true, expected: "brokerctl login NAME --flow device"),
        Endpoints(issuer: true, browser: true, device: true, expected: "brokerctl login NAME"),
    ]

    /// The provider options of an account at `idp` with `endpoints`; an issuer's document names
    /// only the sign-in endpoints `endpoints` has.
    static func providerOptions(_ idp: OAuth2TestIdP, _ endpoints: Endpoints) -> [String] {
        var options = ["--kind", "oauth2", "--client-id", idp.clientID]
        if endpoints.issuer {
            idp.setOffersAuthorizationEndpoint(endpoints.browser)
            idp.setOffersDeviceEndpoint(endpoints.device)
            return options + ["--issuer", idp.issuer]
        }
        options += ["--token-endpoint", idp.tokenEndpoint]
        if endpoints.browser { options += ["--authorization-endpoint", idp.authorizationEndpoint] }
        if endpoints.device { options += ["--device-authorization-endpoint", idp.deviceAuthorizationEndpoint] }
        return options
    }

    /// A denied refresh token, in every combination: the advice is the sign-in the IdP offers,
    /// or a push of the refresh token when it offers none; run as printed, it restores the account.
    @Test(arguments: combinations)
    func theAdviceOfADeniedOAuth2AccountWorksAsPrinted(_ endpoints: Endpoints) async throws {
        try await Self.withBroker { broker in
            let idp = try await OAuth2TestIdP()
            idp.setDeviceTiming(interval: 1)
            try await withCleanup {
                let added = try await broker.brokerctl(
                    ["add", "acct"] + Self.providerOptions(idp, endpoints) + ["--secrets", "-"],
                    stdin: #"{"refresh_token": "rt-the-idp-forgot"}"#)
                #expect(added.status != 64, "\(added.stderr)")
                try await Self.waitForState(broker, "acct", "needs_login")
                let command = try #require(try await Self.status(broker, "acct")?["advice_command"] as? String)
                #expect(command == endpoints.expected.replacing("NAME", with: "acct"))
                // The IdP still honours its current refresh token, which a push hands over.
                try await Self.follow(command, broker: broker, idp: idp, input: #"{"refresh_token": "rt-0"}"#)
                try await Self.waitForState(broker, "acct", "valid")
                #expect(
                    try await broker.brokerctl(["token", "acct"]).stdout
                        == (idp.issuedAccessTokens.last ?? "?") + "\n")
            } cleanup: {
                await idp.shutdown()
            }
        }
    }

    /// A logged-out oauth2 account names the same sign-in, and a static one the push of a token.
    @Test func theAdviceOfALoggedOutAccountWorksAsPrinted() async throws {
        try await Self.withBroker { broker in
            let idp = try await OAuth2TestIdP()
            idp.setDeviceTiming(interval: 1)
            try await withCleanup {
                let endpoints = Endpoints(issuer: false, browser: false, device: true, expected: "")
                _ = try await broker.brokerctl(
                    ["add", "out"] + Self.providerOptions(idp, endpoints) + ["--secrets", "-"],
                    stdin: #"{"refresh_token": "rt-0"}"#)
                try await Self.waitForState(broker, "out", "valid")
                _ = try await broker.brokerctl(
                    ["add", "pushed", "--kind", "static", "--secrets", "-"],
                    stdin: #"{"access_token": "st-1", "expires_in": 600}"#)
                for name in ["out", "pushed"] {
                    #expect(try await broker.brokerctl(["logout", name]).status == 0)
                }

                let signIn = try #require(try await Self.status(broker, "out")?["advice_command"] as? String)
                #expect(signIn == "brokerctl login out --flow device")
                try await Self.follow(signIn, broker: broker, idp: idp, input: nil)
                try await Self.waitForState(broker, "out", "valid")

                let push = try #require(try await Self.status(broker, "pushed")?["advice_command"] as? String)
                #expect(push == "brokerctl set-tokens pushed")
                try await Self.follow(
                    push, broker: broker, idp: nil, input: #"{"access_token": "st-2", "expires_in": 600}"#)
                try await Self.waitForState(broker, "pushed", "valid")
                #expect(try await broker.brokerctl(["token", "pushed"]).stdout == "st-2\n")
            } cleanup: {
                await idp.shutdown()
            }
        }
    }

    /// A wrong client secret: the IdP answers `invalid_client`, and the advice is `update`, which
    /// keeps the refresh token; `set-tokens` with only a client secret does the same. The IdP's
    /// view shows the secret it received and the refresh token presented.
    @Test func aWrongClientSecretIsCorrectedInPlaceByUpdateAndBySetTokens() async throws {
        try await Self.withBroker { broker in
            let viaUpdate = try await OAuth2TestIdP()
            let viaPush = try await OAuth2TestIdP()
            try await withCleanup {
                for (name, idp) in [("fixed-by-update", viaUpdate), ("fixed-by-push", viaPush)] {
                    let added = try await broker.brokerctl(
                        [
                            "add", name, "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id",
                            idp.clientID, "--client-auth", "client_secret_post", "--secrets", "-",
                        ],
                        stdin: #"{"refresh_token": "rt-0", "client_secret": "not-the-secret"}"#)
                    #expect(added.status != 64, "\(added.stderr)")
                    try await Self.waitForState(broker, name, "needs_login")
                    #expect(idp.calls.last?.clientSecret == "not-the-secret")
                }
                let command = try #require(
                    try await Self.status(broker, "fixed-by-update")?["advice_command"] as? String)
                #expect(command == "brokerctl update fixed-by-update --secrets -")
                let secret = #"{"client_secret": "\#(viaUpdate.clientSecret)"}"#
                try await Self.follow(command, broker: broker, idp: viaUpdate, input: secret)
                let pushed = try await broker.brokerctl(
                    ["set-tokens", "fixed-by-push"], stdin: #"{"client_secret": "\#(viaPush.clientSecret)"}"#)
                #expect(pushed.status == 0, "\(pushed.stderr)")
                for (name, idp) in [("fixed-by-update", viaUpdate), ("fixed-by-push", viaPush)] {
                    try await Self.waitForState(broker, name, "valid")
                    let last = try #require(idp.calls.last)
                    #expect(last.clientSecret == idp.clientSecret)
                    #expect(last.refreshToken == "rt-0", "the refresh token was kept")
                    #expect(idp.calls.count == 2)
                }
                // Nothing of either secret in the answers.
                let status = try await broker.brokerctl(["status", "--json"]).stdout
                #expect(!status.contains(viaUpdate.clientSecret) && !status.contains("not-the-secret"))
            } cleanup: {
                await viaUpdate.shutdown()
                await viaPush.shutdown()
            }
        }
    }

    /// `update` checks what it changes as `add` does, and refuses with why a change that would
    /// send the refresh token to another client.
    @Test func updateChecksTheChangeAndKeepsTheCredentialWithItsClient() async throws {
        try await Self.withBroker { broker in
            let idp = try await OAuth2TestIdP()
            try await withCleanup {
                _ = try await broker.brokerctl(
                    [
                        "add", "api", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id",
                        idp.clientID, "--secrets", "-",
                    ],
                    stdin: #"{"refresh_token": "rt-0"}"#)
                try await Self.waitForState(broker, "api", "valid")
                let moved = try await broker.brokerctl(["update", "api", "--client-id", "another-client"])
                #expect(moved.status == 1)
                #expect(moved.stderr.contains("changes its client_id; log it out first"), "\(moved.stderr)")
                let unchecked = try await broker.brokerctl([
                    "update", "api", "--client-auth", "client_secret_basic",
                ])
                #expect(unchecked.status == 1)
                #expect(unchecked.stderr.contains(#"client_auth client_secret_basic needs "client_secret""#))
                let scoped = try await broker.brokerctl(["update", "api", "--scope", "read"])
                #expect(scoped.status == 0, "\(scoped.stderr)")
                #expect(try await broker.brokerctl(["refresh", "api"]).status == 0)
                #expect(idp.calls.last?.scope == "read")
                #expect(try await broker.brokerctl(["update", "api", "--unset", "scope"]).status == 0)
                #expect(try await broker.brokerctl(["refresh", "api"]).status == 0)
                #expect(idp.calls.last?.scope == nil)
            } cleanup: {
                await idp.shutdown()
            }
        }
    }

    /// `client_auth = "none"` set by mistake in broker.toml is set back by a reload, since the
    /// vault holds the secret: the IdP receives it again.
    @Test func aReloadSetsClientAuthBackWhenTheVaultHoldsTheSecret() async throws {
        try await Self.withBroker { broker in
            let idp = try await OAuth2TestIdP()
            try await withCleanup {
                let added = try await broker.brokerctl(
                    [
                        "add", "conf", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id",
                        idp.clientID, "--secrets", "-",
                    ],
                    stdin: #"{"refresh_token": "rt-0", "client_secret": "\#(idp.clientSecret)"}"#)
                #expect(added.status == 0, "\(added.stderr)")
                let table = """
                    [accounts.conf]
                    kind = "oauth2"
                    token_endpoint = "\(idp.tokenEndpoint)"
                    client_id = "\(idp.clientID)"

                    """
                try broker.writeConfig(table + #"client_auth = "none""# + "\n")
                #expect(try await broker.brokerctl(["reload"]).status == 0)
                #expect(try await broker.brokerctl(["refresh", "conf"]).status == 0)
                #expect(idp.calls.last?.clientSecret == nil)
                try broker.writeConfig(table + #"client_auth = "client_secret_basic""# + "\n")
                let reloaded = try await broker.brokerctl(["reload"])
                #expect(reloaded.status == 0, "\(reloaded.stderr)")
                #expect(try await broker.brokerctl(["refresh", "conf"]).status == 0)
                #expect(idp.calls.last?.clientSecret == idp.clientSecret)
                // Without the line, the secret the vault holds is used too (client_secret_basic).
                try broker.writeConfig(table)
                #expect(try await broker.brokerctl(["reload"]).status == 0)
                #expect(try await broker.brokerctl(["refresh", "conf"]).status == 0)
                #expect(idp.calls.last?.clientSecret == idp.clientSecret)
            } cleanup: {
                await idp.shutdown()
            }
        }
    }

    /// The kinds without sign-in: a `refresh_url` whose URL died and a `sliding` account whose
    /// refresh token was refused take a push of the credential; an `exec` command that denied
    /// is asked again by `refresh` once it can sign in; failing refreshes name `refresh` too.
    @Test func theAdviceOfEveryOtherKindWorksAsPrinted() async throws {
        try await Self.withBroker { broker in
            let urlIdP = try await RefreshURLTestIdP()
            let slidingIdP = try await SlidingTestIdP()
            let oauthIdP = try await OAuth2TestIdP()
            let helper = try TemporaryDirectory()
            defer { helper.remove() }
            try await withCleanup {
                let script = helper.file("get-token")
                try """
                #!/bin/sh
                [ -f "\(helper.file("signed-in"))" ] || exit 2
                echo '{"access_token": "exec-at", "expires_in": 600}'
                """.write(toFile: script, atomically: true, encoding: .utf8)
                chmod(script, 0o700)
                urlIdP.revoke()
                let added = [
                    try await broker.brokerctl(
                        ["add", "url", "--kind", "refresh_url", "--secrets", "-"],
                        stdin: #"{"refresh_url": "\#(urlIdP.initialURL)"}"#),
                    try await broker.brokerctl(
                        ["add", "slide", "--kind", "sliding", "--endpoint", slidingIdP.endpoint, "--secrets", "-"],
                        stdin: #"{"refresh_token": "srt-unknown"}"#),
                    try await broker.brokerctl(["add", "cmd", "--kind", "exec", "--command", script]),
                    try await broker.brokerctl(
                        [
                            "add", "flaky", "--kind", "oauth2", "--token-endpoint", oauthIdP.tokenEndpoint,
                            "--client-id", oauthIdP.clientID, "--secrets", "-",
                        ],
                        stdin: #"{"refresh_token": "rt-0", "access_token": "at-held", "expires_in": 3600}"#),
                ]
                for result in added { #expect(result.status != 64, "\(result.stderr)") }
                for name in ["url", "slide", "cmd"] { try await Self.waitForState(broker, name, "needs_login") }
                oauthIdP.setBehavior(.status(503, retryAfter: nil))
                _ = try await broker.brokerctl(["refresh", "flaky"])
                try await Self.waitForState(broker, "flaky", "stale")

                // The advice is read while the states last (the broker retries failing refreshes on its own).
                var commands: [String: String] = [:]
                for (name, expected) in [
                    ("flaky", "brokerctl refresh flaky"), ("url", "brokerctl set-tokens url"),
                    ("slide", "brokerctl set-tokens slide"), ("cmd", "brokerctl refresh cmd"),
                ] {
                    // flaky's own retries make it `refreshing` now and then, without advice.
                    var status: [String: Any]?
                    _ = try await eventually(timeout: 5) {
                        status = try await Self.status(broker, name)
                        return status?["advice_command"] != nil
                    }
                    commands[name] = try #require(status?["advice_command"] as? String, "\(String(describing: status))")
                    #expect(commands[name] == expected)
                }
                #expect(FileManager.default.createFile(atPath: helper.file("signed-in"), contents: Data()))
                oauthIdP.setBehavior(.normal)
                let inputs = [
                    "url": #"{"refresh_url": "\#(urlIdP.reissue())"}"#, "slide": #"{"refresh_token": "srt-0"}"#,
                ]
                for (name, command) in commands {
                    try await Self.follow(command, broker: broker, idp: nil, input: inputs[name])
                    try await Self.waitForState(broker, name, "valid")
                }
                #expect(try await broker.brokerctl(["token", "cmd"]).stdout == "exec-at\n")
            } cleanup: {
                await urlIdP.shutdown()
                await slidingIdP.shutdown()
                await oauthIdP.shutdown()
            }
        }
    }

    // MARK: Support

    /// Runs `body` with a started broker, stopped on every way out.
    static func withBroker(_ body: (BrokerProcess) async throws -> Void) async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        try await body(broker)
    }

    /// `status NAME --json`'s account object.
    static func status(_ broker: BrokerProcess, _ account: String) async throws -> [String: Any]? {
        let result = try await broker.brokerctl(["status", account, "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
        return (object?["accounts"] as? [[String: Any]])?.first
    }

    /// Waits until `account` is in `state`, failing with its status after 20 s.
    static func waitForState(_ broker: BrokerProcess, _ account: String, _ state: String) async throws {
        var last: [String: Any]?
        let reached = try await eventually(timeout: 20) {
            last = try await status(broker, account)
            return last?["state"] as? String == state
        }
        if reached { return }
        Issue.record("\(account) never became \(state): \(String(describing: last))")
        throw HarnessError("\(account) never became \(state)")
    }

    /// Runs `command` (brokerctl's words, as `advice_command` prints them) with `input` on stdin.
    /// A sign-in is played as the user would: the device code approved at `idp`, or the browser
    /// flow's link opened by a browser that signs in (`--json` is added to read the link).
    static func follow(_ command: String, broker: BrokerProcess, idp: OAuth2TestIdP?, input: String?) async throws {
        let words = command.split(separator: " ").map(String.init)
        #expect(words.first == "brokerctl")
        let arguments = Array(words.dropFirst())
        guard arguments.first == "login", let idp else {
            let result = try await broker.brokerctl(arguments, stdin: input)
            #expect(result.status == 0, "\(command): \(result.stderr)")
            return
        }
        if command.hasSuffix("--flow browser") {
            let login = try BackgroundBrokerctl(broker, arguments + ["--json"])
            let url = try #require(try await login.jsonEvent("authorization_url")["url"] as? String)
            #expect(try await TestBrowser().signIn(url).status == 200)
            #expect(await login.finish() == 0, "\(command): \(login.stderr)")
        } else {
            // Without a display, brokerctl runs the device flow.
            let login = try BackgroundBrokerctl(broker, arguments)
            #expect(try await idp.decide(.approve, at: try await login.deviceLink()) == 200)
            #expect(await login.finish() == 0, "\(command): \(login.stderr)")
        }
    }
}
