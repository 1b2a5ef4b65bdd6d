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
    /// A PostgreSQL server and a fleet key made by `brokerctl fleet init` in a directory of its own.
    static func fleet() async throws -> (PostgresServer, TemporaryDirectory, key: String) {
        let server = try await PostgresServer.start()
        let keys = try TemporaryDirectory()
        let key = keys.file("fleet.key")
        let made = try FleetStartTests.fleetInit(key)
        guard made.status == 0 else {
            server.stop()
            keys.remove()
            throw HarnessError("brokerctl fleet init failed: \(made.stderr)")
        }
        return (server, keys, key)
    }

    @Test func twoBrokersServeOneSharedAccountAndTheIdPSeesEachRefreshTokenOnce() async throws {
        let (server, keys, key) = try await Self.fleet()
        defer {
            server.stop()
            keys.remove()
        }
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-shared", lifetime: 4)
        do {
            // A lease of 6 s, so that a host reads the store again every 6 s.
            let (settings, lease) = ("request_timeout = 2", "lease_seconds = 6")
            let a = try FleetStartTests.broker(on: server, key: key, host: "a", broker: settings, fleet: lease)
            try await a.start()
            defer { a.stop() }
            let added = try await a.brokerctl(
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
            let b = try FleetStartTests.broker(on: server, key: key, host: "b", broker: settings, fleet: lease)
            try await b.start()
            defer { b.stop() }
            let clientB = try b.client()
            defer { clientB.close() }

            // Until five refreshes (five token lifetimes), each broker asked in turn for the token, and every
            // fourth round for one narrowed to a scope: its refreshes take the same lease and
            // chain. Every refresh of the account drops the narrowed tokens (the IdP may revoke
            // them), so a scoped request may find the caller's budget of new ones spent (`busy`).
            var (answers, refused, round, scopedAnswers) = (0, 0, 0, 0)
            _ = try await eventually(timeout: 60) {
                round += 1
                for client in [clientA, clientB] {
                    for scope in round % 4 == 0 ? [nil, "read"] : [nil] {
                        // Served at some instant between the request and its answer: valid then.
                        let asked = Date()
                        let token: String
                        do {
                            token = try await client.token(account: "api", minTTL: 1, scope: scope).accessToken
                        } catch let error as BrokerError where scope != nil && error.code == .busy {
                            continue
                        }
                        let answered = Date()
                        answers += 1
                        if scope != nil { scopedAnswers += 1 }
                        if !idp.accepted(token, at: asked, grace: 0.2), !idp.accepted(token, at: answered, grace: 0.2) {
                            refused += 1
                        }
                    }
                }
                return idp.refreshCalls.count >= 5 && scopedAnswers >= 4
            }
            let calls = idp.refreshCalls
            #expect(scopedAnswers >= 4, "\(scopedAnswers) scoped tokens served")
            #expect(calls.contains { $0.scope == "read" } && calls.contains { $0.scope == nil })
            #expect(refused == 0, "\(refused) of \(answers) answers held a token the IdP does not accept")
            #expect(calls.count >= 4, "the tokens were refreshed (\(calls.count) refreshes)")
            let reused = calls.filter { !$0.presentedCurrent }.count
            #expect(reused == 0, "a refresh token was presented twice")
            #expect(Set(calls.compactMap(\.refreshToken)).count == calls.count, "one IdP call per rotation")
            #expect(a.log.contains("refreshed by another host") || b.log.contains("refreshed by another host"))
            #expect(!a.log.contains("rt-shared") && !b.log.contains("rt-shared"), "no refresh token in a log")

            // Both show the account as shared, at the version each has read (b may not have read a's
            // last commit yet), committed by one of the two; a lease, if any, is a's own refresh
            // under way (status shows only the holder's own).
            let statusA = try #require(try await clientA.status().first { $0.account == "api" })
            let statusB = try #require(try await clientB.status().first { $0.account == "api" })
            #expect(statusA.shared == true && statusB.shared == true)
            let versions = [statusA.version ?? 0, statusB.version ?? 0]
            #expect(versions.min()! >= 2 && versions.max()! - versions.min()! <= 1, "\(versions)")
            #expect(["a", "b"].contains(statusA.lastRefreshedBy ?? ""))
            #expect([nil, "a"].contains(statusA.leaseHolder), "\(statusA.leaseHolder ?? "")")
            // The IdP's calls counted after the versions were read: refreshes go on meanwhile.
            #expect(Int64(idp.refreshCalls.count) + 1 >= versions.max()!, "one version per refresh at most")

            // Removed on b: gone from the store, and from a within a lease or two.
            #expect(try await server.dump().contains("\napi\t"), "the row is there")
            #expect(try await b.brokerctl(["remove", "api"]).status == 0)
            #expect(try await server.dump().contains("\napi\t") == false, "the row is deleted")
            var code: BrokerError.Code?
            _ = await eventually(timeout: 15) {
                do {
                    _ = try await clientA.token(account: "api", minTTL: 1)
                } catch {
                    code = (error as? BrokerError)?.code
                }
                return code == .notFound
            }
            #expect(code == .notFound, "a stopped serving the account removed on b")
        } catch {
            await idp.shutdown()
            throw error
        }
        await idp.shutdown()
    }

    @Test func aTamperedRowIsRefusedByNameAndTheOtherSharedAccountsAreServed() async throws {
        let (server, keys, key) = try await Self.fleet()
        defer {
            server.stop()
            keys.remove()
        }
        let a = try FleetStartTests.broker(on: server, key: key, host: "a")
        try await a.start()
        defer { a.stop() }
        for name in ["api", "git", "web"] {
            let added = try await a.brokerctl(
                ["add", name, "--shared", "--kind", "static", "--secrets", "-"],
                stdin: #"{"access_token": "at-\#(name)-in-the-row", "expires_in": 3600}"#)
            #expect(added.status == 0, "\(added.stderr)")
        }
        let dump = try await server.dump()
        #expect(!dump.contains("-in-the-row"), "no access token in clear in the database")

        // git's sealed bytes changed; web's replaced by api's (a row copied onto another name).
        try await server.execute(
            "UPDATE tokenbroker_accounts SET sealed = overlay(sealed placing '\\x00'::bytea from 40 for 1) WHERE name = 'git'"
        )
        try await server.execute(
            """
            UPDATE tokenbroker_accounts SET (sealed, version) = (SELECT sealed, version FROM tokenbroker_accounts
            WHERE name = 'api') WHERE name = 'web'
            """)
        let b = try FleetStartTests.broker(on: server, key: key, host: "b")
        try await b.start()
        defer { b.stop() }
        let client = try b.client()
        defer { client.close() }
        #expect(try await client.token(account: "api").accessToken == "at-api-in-the-row")
        for name in ["git", "web"] {
            let error = await #expect(throws: BrokerError.self) { try await client.token(account: name) }
            #expect(error?.code == .notFound)
            #expect(b.log.contains("shared account refused") && b.log.contains("\"\(name)\""), "logged by name")
        }
        #expect(try await client.hello().protocol == 1, "b keeps serving")
    }
}
