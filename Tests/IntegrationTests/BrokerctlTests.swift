import BrokerProtocol
import Foundation
import TestIdP
import Testing

/// brokerctl as scripts use it: tokens on stdout only, secrets from stdin, distinct exit codes.
@Suite struct BrokerctlTests {
    @Test func scriptsGetTokensAndDistinctExitCodes() async throws {
        let broker = try BrokerProcess()
        let notRunning = try broker.brokerctl(["token", "api"])
        #expect(notRunning.status == 3)
        #expect(notRunning.stderr.contains("not running"))

        try await broker.start()
        defer { broker.stop() }
        let added = try broker.brokerctl(
            ["add", "api", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"tok-123","expires_in":600}"#)
        #expect(added.status == 0, "\(added.stderr)")

        let token = try broker.brokerctl(["token", "api"])
        #expect(token.status == 0)
        #expect(token.stdout == "tok-123\n")

        let json = try broker.brokerctl(["token", "api", "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        #expect(object?["access_token"] as? String == "tok-123")

        #expect(try broker.brokerctl(["token", "nobody"]).status == 4)
        // Valid for 600 s, so a min_ttl of an hour cannot be met by a static account.
        #expect(try broker.brokerctl(["token", "api", "--min-ttl", "3600"]).status == 5)

        let status = try broker.brokerctl(["status"])
        #expect(status.status == 0)
        #expect(status.stdout.contains("api") && status.stdout.contains("valid"))
        #expect(!status.stdout.contains("tok-123"))

        let replaced = try broker.brokerctl(
            ["set-tokens", "api"], stdin: #"{"access_token":"tok-456","expires_in":600}"#)
        #expect(replaced.status == 0)
        #expect(try broker.brokerctl(["token", "api"]).stdout == "tok-456\n")

        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-ctl", lifetime: 3600)
        idp.setBehavior(.status(503, retryAfter: 30))
        let oauth = try broker.brokerctl(
            ["add", "flaky", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id", idp.clientID,
             "--client-auth", "client_secret_post", "--secrets", "-"],
            stdin: #"{"refresh_token":"rt-ctl","client_secret":"\#(idp.clientSecret)"}"#)
        #expect(oauth.status == 0, "\(oauth.stderr)")
        #expect(await eventually { idp.callCount >= 1 })
        #expect(try broker.brokerctl(["token", "flaky"]).status == 6)
        #expect(try broker.brokerctl(["refresh", "flaky"]).status == 6)
        idp.setBehavior(.normal)
        let refreshed = try broker.brokerctl(["refresh", "flaky"])
        #expect(refreshed.status == 0, "\(refreshed.stderr)")
        #expect(try broker.brokerctl(["token", "flaky"]).stdout == idp.issuedAccessTokens.last.map { $0 + "\n" })
        #expect(idp.calls.last?.clientSecret == idp.clientSecret)

        #expect(try broker.brokerctl(["remove", "api"]).status == 0)
        #expect(try broker.brokerctl(["token", "api"]).status == 4)
        await idp.shutdown()
    }
}
