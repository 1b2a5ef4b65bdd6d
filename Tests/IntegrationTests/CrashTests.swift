import BrokerClient
import BrokerProtocol
import Foundation
import TestIdP
import Testing

/// brokerd killed with SIGKILL at random moments while it rotates one-time refresh tokens:
/// the vault is readable after every restart, and the accounts keep working.
@Suite struct CrashTests {
    static let accounts = 5
    static let kills = 100

    @Test func vaultSurvivesOneHundredKillsDuringRotation() async throws {
        var idps: [OAuth2TestIdP] = []
        for index in 0..<Self.accounts {
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
        owner.close()

        for _ in 0..<Self.kills {
            try await Task.sleep(for: .milliseconds(Int.random(in: 50...700)))
            broker.crash()
            // Every restart must find a readable, consistent vault.
            try await broker.start()
        }
        let refreshes = idps.reduce(0) { $0 + $1.issuedAccessTokens.count }
        #expect(refreshes > Self.kills / 2, "the kills landed while refreshes were happening")

        // Let every account refresh at least once more after the last restart.
        try await Task.sleep(for: .seconds(3))
        let client = try broker.client()
        let states = try await client.status().map(\.state)
        let needsLogin = states.filter { $0 == "needs_login" }.count
        let reused = idps.reduce(0) { $0 + $1.rejectedReuse }
        let windows = Self.figures("saved_after_us", in: broker.log)
        let roundTrips = Self.figures("idp_us", in: broker.log)
        let completedSaves =
            broker.log.components(separatedBy: "completed a vault save that a crash interrupted").count - 1
        print(
            "crash test: \(Self.kills) SIGKILLs, \(refreshes) refreshes, \(needsLogin) of \(Self.accounts) accounts in needs_login, "
                + "\(reused) reused refresh tokens, \(completedSaves) interrupted saves completed at restart; "
                + "IdP round trip: median \(Self.median(roundTrips)) us, p99 \(Self.p99(roundTrips)) us; "
                + "IdP answer to fsync: median \(Self.median(windows)) us, p99 \(Self.p99(windows)) us"
        )
        #expect(!windows.isEmpty)
        #expect(states.count == Self.accounts)
        for index in 0..<Self.accounts where states[index] != "needs_login" {
            let token = try await client.token(account: "crash-\(index)", minTTL: 0)
            #expect(idps[index].issuedAccessTokens.contains(token.accessToken))
        }
        client.close()
        #expect(broker.stop() == 0)
        for idp in idps { await idp.shutdown() }
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
