import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// One account shared by two brokers through a real PostgreSQL server, against a test IdP that
/// rotates the refresh token at every refresh and refuses a used one: one broker at a time
/// refreshes, the other takes its commit, and the IdP sees every refresh token once.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetSharingTests {
    @Test func twoBrokersServeOneSharedAccountAndTheIdPSeesEachRefreshTokenOnce() async throws {
        let server = try PostgresServer()
        defer { server.stop() }
        let keys = try TemporaryDirectory()
        defer { keys.remove() }
        let key = keys.file("fleet.key")
        #expect(try FleetStartTests.fleetInit(key).status == 0)
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-shared", lifetime: 4)
        do {
            let a = try FleetStartTests.broker(on: server, key: key, host: "a")
            try await a.start()
            defer { a.stop() }
            let added = try a.brokerctl(
                [
                    "add", "api", "--shared", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint,
                    "--client-id", idp.clientID, "--secrets", "-",
                ],
                stdin: #"{"refresh_token": "rt-shared", "client_secret": "\#(idp.clientSecret)"}"#)
            #expect(added.status == 0, "\(added.stderr)")
            #expect(added.stdout.contains("to the fleet"))
            let clientA = try a.client()
            defer { clientA.close() }
            _ = try await clientA.token(account: "api", minTTL: 1)

            // b starts after the account was shared, and serves it from the row.
            let b = try FleetStartTests.broker(on: server, key: key, host: "b")
            try await b.start()
            defer { b.stop() }
            let clientB = try b.client()
            defer { clientB.close() }

            // Five token lifetimes, each broker asked in turn.
            let end = Date().addingTimeInterval(20)
            var answers = 0
            var refused = 0
            while Date() < end {
                for client in [clientA, clientB] {
                    let token = try await client.token(account: "api", minTTL: 1).accessToken
                    answers += 1
                    if !idp.accepted(token, at: Date(), grace: 0.5) { refused += 1 }
                }
                try await Task.sleep(for: .milliseconds(100))
            }
            let calls = idp.refreshCalls
            #expect(refused == 0, "\(refused) of \(answers) answers held a token the IdP does not accept")
            #expect(calls.count >= 4, "the tokens were refreshed (\(calls.count) refreshes)")
            let reused = calls.filter { !$0.presentedCurrent }.count
            #expect(reused == 0, "a refresh token was presented twice")
            #expect(Set(calls.compactMap(\.refreshToken)).count == calls.count, "one IdP call per rotation")
            #expect(a.log.contains("refreshed by another host") || b.log.contains("refreshed by another host"))
            #expect(!a.log.contains("rt-shared") && !b.log.contains("rt-shared"), "no refresh token in a log")
        } catch {
            await idp.shutdown()
            throw error
        }
        await idp.shutdown()
    }
}
