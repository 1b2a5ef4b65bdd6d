import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// `brokerctl share`, `unshare` and `fleet status` between two real brokers on one PostgreSQL
/// server: a shared account is served by the other host, an unshared one stops being served
/// there within a lease, and `fleet status` names both hosts.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetMoveCommandTests {
    /// `brokerctl login NAME --shared` says `done` only once the account is in the fleet's
    /// database; when the database does not answer, it fails instead, and the share completes
    /// once the database is back.
    @Test func aSharedLoginIsDoneOnlyOnceTheAccountIsInTheFleet() async throws {
        let (server, keys, key) = try await FleetSharingTests.fleet()
        defer {
            server.stop()
            keys.remove()
        }
        let idp = try await OAuth2TestIdP()
        do {
            idp.setDeviceTiming(interval: 1)
            // A lease of 6 s: a call to the database is given up after 2 s.
            let a = try FleetStartTests.broker(
                on: server, key: key, host: "a", broker: "request_timeout = 2", fleet: "lease_seconds = 6")
            try await a.start()
            defer { a.stop() }
            for (name, reachable) in [("web", true), ("late", false)] {
                let login = try BackgroundBrokerctl(
                    a, ["login", name, "--flow", "device", "--shared", "--json"] + LoginCommandTests.provider(idp))
                let code = try await login.jsonEvent("device_code")
                if !reachable { server.halt() }
                let link = try #require(code["verification_uri_complete"] as? String)
                #expect(try await idp.decide(.approve, at: link) == 200)
                let status = await login.finish()
                let done = login.jsonLines.contains { $0["event"] as? String == "done" }
                if reachable {
                    #expect(status == 0 && done, "\(login.stderr)")
                    #expect(login.stderr.contains("shared web with the fleet"))
                    #expect(try await server.dump().contains("\nweb\t"), "the row is there")
                } else {
                    #expect(status != 0 && !done, "no done while the share is not settled: \(login.stdout)")
                    #expect(login.stderr.contains("the share completes once"), "\(login.stderr)")
                    try await server.resume()
                    let landed = await eventually(timeout: 30) {
                        (try? await server.dump().contains("\nlate\t")) == true
                    }
                    #expect(landed, "the share completes once the database answers")
                }
            }
        } catch {
            await idp.shutdown()
            throw error
        }
        await idp.shutdown()
    }

    @Test func aSharedAccountIsServedByTheOtherHostAndAnUnsharedOneStopsThere() async throws {
        let (server, keys, key) = try await FleetSharingTests.fleet()
        defer {
            server.stop()
            keys.remove()
        }
        // A lease of 6 s: each broker reads the store again every 6 s.
        let (settings, lease) = ("request_timeout = 2", "lease_seconds = 6")
        let a = try FleetStartTests.broker(on: server, key: key, host: "a", broker: settings, fleet: lease)
        try await a.start()
        defer { a.stop() }
        let b = try FleetStartTests.broker(on: server, key: key, host: "b", broker: settings, fleet: lease)
        try await b.start()
        defer { b.stop() }
        let added = try await a.brokerctl(
            ["add", "ci", "--kind", "static", "--secrets", "-"],
            stdin: #"{"access_token": "at-ci-moved", "expires_in": 3600}"#)
        #expect(added.status == 0, "\(added.stderr)")
        #expect(try await server.dump().contains("\nci\t") == false, "a local account has no row")

        let shared = try await a.brokerctl(["share", "ci"])
        #expect(shared.status == 0 && shared.stdout.contains("shared ci with the fleet"), "\(shared.stderr)")
        #expect(try await server.dump().contains("\nci\t"), "the row is there")
        #expect(try await a.brokerctl(["share", "ci"]).stderr.contains("shared already"))
        let clientB = try b.client()
        defer { clientB.close() }
        #expect(try await Self.served(by: clientB, within: 15) == "at-ci-moved", "b serves it within a lease")
        let table = try await b.brokerctl(["status"])
        #expect(table.stdout.contains("static (shared)"), "\(table.stdout)")

        let fleet = try await a.brokerctl(["fleet", "status", "--json"])
        #expect(fleet.status == 0, "\(fleet.stderr)")
        let status = try JSONDecoder().decode(FleetStatusResult.self, from: Data(fleet.stdout.utf8))
        #expect(status.reachable && status.host == "a" && status.sharedAccounts == 1 && status.schema == 2)
        #expect(Set(status.hosts.map(\.host)) == ["a", "b"])
        #expect(try await a.brokerctl(["fleet", "status"]).stdout.contains("database: reachable"))

        // Unshared on b: local there, gone from the store, and from a within a lease or two.
        let unshared = try await b.brokerctl(["unshare", "ci"])
        #expect(unshared.status == 0, "\(unshared.stderr)")
        #expect(try await server.dump().contains("\nci\t") == false, "the row is deleted")
        #expect(try await clientB.token(account: "ci", minTTL: 1).accessToken == "at-ci-moved")
        #expect(try await clientB.status().first { $0.account == "ci" }?.shared == nil, "local on b")
        let clientA = try a.client()
        defer { clientA.close() }
        var code: BrokerError.Code?
        _ = await eventually(timeout: 15) {
            do {
                _ = try await clientA.token(account: "ci", minTTL: 1)
            } catch {
                code = (error as? BrokerError)?.code
            }
            return code == .notFound
        }
        #expect(code == .notFound, "a stopped serving the account unshared on b")
        // b restarted keeps it: the move settled in its vault.
        b.stop()
        try await b.start()
        let again = try b.client()
        defer { again.close() }
        #expect(try await again.token(account: "ci", minTTL: 1).accessToken == "at-ci-moved")
    }

    /// The token `client` serves for `ci` once it serves one, polling for at most `seconds`.
    static func served(by client: BrokerClient, within seconds: Double) async throws -> String? {
        var served: String?
        _ = await eventually(timeout: seconds) {
            served = try? await client.token(account: "ci", minTTL: 1).accessToken
            return served != nil
        }
        return served
    }
}
