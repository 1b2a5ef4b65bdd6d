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
        let refused = try broker.brokerctl(["reload"])
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("line 3"))
        #expect(try await client.status().map(\.account) == ["declared", "second"])

        // Secrets never belong in the file.
        try broker.writeConfig("[accounts.leaky]\nkind = \"oauth2\"\nclient_secret = \"s3cret-in-file\"\n")
        let secret = try broker.brokerctl(["reload"])
        #expect(secret.status != 0)
        #expect(secret.stderr.contains("never holds"))
        #expect(!secret.stderr.contains("s3cret-in-file"))

        // A good file again: applied.
        try broker.writeConfig("[accounts.third]\nkind = \"static\"\n")
        let applied = try broker.brokerctl(["reload"])
        #expect(applied.status == 0, "\(applied.stderr)")
        #expect(try await client.status().map(\.account) == ["declared", "second", "third"])
        await idp.shutdown()
    }
}
