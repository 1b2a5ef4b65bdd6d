import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// brokerd killed with SIGKILL at random moments while it rotates one-time refresh tokens:
/// the vault is readable after every restart, and the accounts keep working. Run on a vault
/// of 5 accounts and on one of 1,000, where most accounts only hold a pushed 800-byte token
/// (a 1 MB vault, whose saves append to its log and now and then compact it).
@Suite(.serialized) struct CrashTests {
    static let kills = 100

    /// The accounts in the vault, and how many of them rotate a refresh token on every refresh
    /// (each against its own IdP, with 2-second tokens); the rest are static.
    struct Scenario: Sendable, CustomTestStringConvertible {
        let accounts: Int
        let rotating: Int

        var testDescription: String { "\(accounts) accounts, \(rotating) rotating" }
    }

    @Test(arguments: [Scenario(accounts: 5, rotating: 5), Scenario(accounts: 1000, rotating: 20)])
    func vaultSurvivesOneHundredKillsDuringRotation(_ scenario: Scenario) async throws {
        var idps: [OAuth2TestIdP] = []
        for index in 0..<scenario.rotating {
            idps.append(try await OAuth2TestIdP(initialRefreshToken: "rt-crash-\(index)", lifetime: 2))
        }
        let broker = try BrokerProcess()
        try await broker.start()
        let owner = try broker.client()
        for (index, idp) in idps.enumerated() {
            _ = try await owner.add(
                account: "crash-\(index)",
                provider: ProviderSpec(
                    kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
                tokens: TokenSet(refreshToken: "rt-crash-\(index)"))
        }
        let pushed = (scenario.rotating..<scenario.accounts).map {
            "static-\($0)-" + String(repeating: "x", count: 800)
        }
        for (offset, token) in pushed.enumerated() {
            _ = try await owner.add(
                account: "static-\(scenario.rotating + offset)", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: token, expiresIn: 86_400))
        }
        owner.close()

        for _ in 0..<Self.kills {
            // brokerd runs, refreshing its 2-second tokens, until the kill at a random moment.
            try await Task.sleep(for: .milliseconds(Int.random(in: 50...700)))
            broker.crash()
            // Every restart must find a readable, consistent vault.
            try await broker.start()
        }
        let refreshes = idps.reduce(0) { $0 + $1.issuedAccessTokens.count }
        #expect(refreshes > Self.kills / 2, "the kills landed while refreshes were happening")

        // Every account refreshes at least once more after the last restart, but one a lost
        // rotation left in needs_login.
        let client = try broker.client()
        let before = idps.map(\.issuedAccessTokens.count)
        _ = try await eventually(timeout: 30) {
            let statuses = try await client.status()
            let states = Dictionary(uniqueKeysWithValues: statuses.map { ($0.account, $0.state) })
            return idps.indices.allSatisfy {
                idps[$0].issuedAccessTokens.count > before[$0] || states["crash-\($0)"] == "needs_login"
            }
        }
        let statuses = try await client.status()
        let states = Dictionary(uniqueKeysWithValues: statuses.map { ($0.account, $0.state) })
        let needsLogin = states.values.filter { $0 == "needs_login" }.count
        let reused = idps.reduce(0) { $0 + $1.rejectedReuse }
        let windows = Self.figures("saved_after_us", in: broker.log)
        let roundTrips = Self.figures("idp_us", in: broker.log)
        let completedSaves =
            broker.log.components(separatedBy: "completed a vault save that a crash interrupted").count - 1
        print(
            "crash test, \(scenario.testDescription): \(Self.kills) SIGKILLs, \(refreshes) refreshes, "
                + "\(needsLogin) of \(scenario.rotating) rotating accounts in needs_login, "
                + "\(reused) reused refresh tokens, \(completedSaves) interrupted saves completed at restart; "
                + "IdP round trip: median \(Self.median(roundTrips)) us, p99 \(Self.p99(roundTrips)) us; "
                + "IdP answer to fsync: median \(Self.median(windows)) us, p99 \(Self.p99(windows)) us"
        )
        #expect(!windows.isEmpty)
        #expect(states.count == scenario.accounts)
        for (index, idp) in idps.enumerated() {
            // A refresh token the broker saved (it logs "refreshed" only then) is never lost: the
            // rotations it lost (a kill between the IdP's rotation and the save) are others.
            let saved = broker.log.components(separatedBy: "refreshed account=crash-\(index) ").count - 1
            let lost = Self.lostRotations(idp, initial: "rt-crash-\(index)")
            #expect(
                saved + lost <= idp.issuedRefreshTokens.count,
                "crash-\(index): \(saved) rotations saved, \(lost) lost, \(idp.issuedRefreshTokens.count) issued")
            guard states["crash-\(index)"] != "needs_login" else { continue }
            let token = try await client.token(account: "crash-\(index)", minTTL: 0)
            #expect(idp.issuedAccessTokens.contains(token.accessToken))
        }
        for (offset, token) in pushed.enumerated() {
            let served = try await client.token(account: "static-\(scenario.rotating + offset)", minTTL: 0)
            #expect(served.accessToken == token)
        }
        client.close()
        #expect(broker.stop() == 0)
        for idp in idps { await idp.shutdown() }
    }

    /// How many rotations the broker lost: for each refresh token it presented after the IdP
    /// had rotated it, the tokens the IdP had issued since (counted once per token presented).
    static func lostRotations(_ idp: OAuth2TestIdP, initial: String) -> Int {
        let chain = [initial] + idp.issuedRefreshTokens
        var current = 0
        var presentedStale: Set<Int> = []
        var lost = 0
        for call in idp.calls {
            if current < chain.count, call.refreshToken == chain[current] {
                current += 1
            } else if let presented = chain.firstIndex(where: { $0 == call.refreshToken }),
                presentedStale.insert(presented).inserted
            {
                lost += current - presented
            }
        }
        return lost
    }

    /// The sorted values of `key=N` in every log line that has it.
    static func figures(_ key: String, in log: String) -> [Int] {
        log.split(separator: "\n").compactMap { line in
            line.range(of: key + "=").flatMap { Int(line[$0.upperBound...].prefix { $0.isNumber }) }
        }.sorted()
    }

    static func median(_ sorted: [Int]) -> Int { sorted.isEmpty ? 0 : sorted[sorted.count / 2] }
    static func p99(_ sorted: [Int]) -> Int { sorted.isEmpty ? 0 : sorted[sorted.count * 99 / 100] }
}
