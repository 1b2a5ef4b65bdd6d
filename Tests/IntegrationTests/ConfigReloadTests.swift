import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `broker.toml`: declared accounts, SIGHUP and `brokerctl reload`, a broken file refused.
@Suite struct ConfigReloadTests {
    @Test func declaredAccountsReloadOnHangupAndABrokenFileChangesNothing() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-decl", lifetime: 3600)
        let broker = try BrokerProcess()
        try broker.writeConfig(
            """
            [accounts.declared]
            kind = "oauth2"
            token_endpoint = "\(idp.tokenEndpoint)"
            client_id = "\(idp.clientID)"
            """)
        let notifyPath = broker.root.appendingPathComponent("notify.sock").path
        let notify = try DatagramListener(path: notifyPath)
        try await broker.startWithNotifySocket(notifyPath)
        while let message = notify.receive(), !message.contains("READY=1") {}
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }

        // Declared with no secret: it waits for tokens, then works.
        #expect(try await client.status().map(\.account) == ["declared"])
        _ = try await client.setTokens(account: "declared", tokens: TokenSet(refreshToken: "rt-decl"))
        #expect(try await client.token(account: "declared").accessToken == idp.issuedAccessTokens.last)

        // SIGHUP re-reads the file: RELOADING=1 with MONOTONIC_USEC, then READY=1.
        try broker.writeConfig(
            """
            [broker]
            default_min_ttl = 10

            [accounts.declared]
            kind = "oauth2"
            token_endpoint = "\(idp.tokenEndpoint)"
            client_id = "\(idp.clientID)"

            [accounts.second]
            kind = "static"
            """)
        broker.signal(SIGHUP)
        var reloading: String?
        var readyAfterReload = false
        while let message = notify.receive(timeout: 10) {
            if message.contains("RELOADING=1") { reloading = message }
            if reloading != nil, message.contains("READY=1") {
                readyAfterReload = true
                break
            }
        }
        #expect(reloading?.contains("MONOTONIC_USEC=") == true)
        #expect(readyAfterReload)
        #expect(try await client.status().map(\.account) == ["declared", "second"])
        #expect(try await client.token(account: "declared").accessToken == idp.issuedAccessTokens.last)

        // A broken file is refused, naming the line, and the running configuration stays.
        try broker.writeConfig("[broker]\ndefault_min_ttl = 10\n[accounts.third\nkind = \"static\"\n")
        let refused = try await broker.brokerctl(["reload"])
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("line 3"))
        #expect(try await client.status().map(\.account) == ["declared", "second"])

        // Secrets never belong in the file.
        try broker.writeConfig("[accounts.leaky]\nkind = \"oauth2\"\nclient_secret = \"s3cret-in-file\"\n")
        let secret = try await broker.brokerctl(["reload"])
        #expect(secret.status != 0)
        #expect(secret.stderr.contains("never holds"))
        #expect(!secret.stderr.contains("s3cret-in-file"))

        // A good file again: applied.
        try broker.writeConfig("[accounts.third]\nkind = \"static\"\n")
        let applied = try await broker.brokerctl(["reload"])
        #expect(applied.status == 0, "\(applied.stderr)")
        #expect(try await client.status().map(\.account) == ["declared", "second", "third"])
        await idp.shutdown()
    }

    /// A token file (`export_file`, `wlcg_account`) of an account whose rule names programs would
    /// hand its token to every process of the user: refused at start and at reload, saying why,
    /// and the running broker keeps its configuration.
    @Test func aTokenFileBesideAnAccessRuleIsRefusedAtStartAndAtReload() async throws {
        let broker = try BrokerProcess()
        let exportFile = broker.root.appendingPathComponent("run/api.token").path
        let rule = "[accounts.api.access]\nexecutables = [\"/usr/bin/git\"]\n"
        let guarded = "[accounts.api]\nkind = \"static\"\n" + rule
        let refusals = [
            ("[accounts.api]\nkind = \"static\"\nexport_file = \"\(exportFile)\"\n" + rule, "accounts.api.export_file"),
            ("[broker]\nwlcg_account = \"api\"\n\n" + guarded, "broker.wlcg_account"),
        ]
        let why = "every process of yours can read the token file"
        for (config, key) in refusals {
            try broker.writeConfig(config)
            #expect(try await broker.runExpectingExit() != 0)
            #expect(broker.log.contains(key) && broker.log.contains(why), "\(broker.log)")
        }

        try broker.writeConfig(guarded)
        try await broker.start()
        defer { broker.stop() }
        let pushed = try await broker.brokerctl(
            ["set-tokens", "api"], stdin: #"{"access_token": "at-guarded", "expires_in": 3600}"#)
        #expect(pushed.status == 0, "\(pushed.stderr)")
        for (config, key) in refusals {
            try broker.writeConfig(config)
            let refused = try await broker.brokerctl(["reload"])
            #expect(refused.status != 0)
            #expect(refused.stderr.contains(key) && refused.stderr.contains(why), "\(refused.stderr)")
            // The rule stays in force (this test runs no listed executable), and no file is written.
            #expect(try await broker.brokerctl(["token", "api"]).status == 7)
            #expect(try await broker.brokerctl(["status"]).status == 0)
            #expect(!FileManager.default.fileExists(atPath: exportFile))
            #expect(
                !FileManager.default.fileExists(atPath: broker.root.appendingPathComponent("run/bt_u\(getuid())").path))
        }
    }
}
