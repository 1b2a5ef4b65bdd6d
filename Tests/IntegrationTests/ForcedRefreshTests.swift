import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// Refreshes a client would force, against the real brokerd and a test IdP that counts them
/// (docs/limits.md): with `minimum_refresh_interval = 60`, 30 rejects in a row of the token
/// just served make one refresh, and 200 new scopes from one caller make only the refreshes
/// its budget holds (10), every other request answered `busy` with `retry_after_ms` at once.
@Suite struct ForcedRefreshTests {
    @Test func rejectsAndNewScopesRefreshOnlyWithinTheBudget() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-budget", lifetime: 3600)
        let broker = try BrokerProcess()
        try broker.writeConfig("[broker]\nminimum_refresh_interval = 60\n")
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        _ = try await client.add(
            account: "api", provider: idp.provider(),
            tokens: TokenSet(accessToken: "at-budget", expiresIn: 3600, refreshToken: "rt-budget"))

        var served = try await client.token(account: "api").accessToken
        for _ in 0..<30 {
            served = try await client.reject(account: "api", accessToken: served).accessToken
        }
        #expect(idp.refreshCalls.count == 1, "one refresh for 30 rejects")
        #expect(served == idp.issuedAccessTokens.first)

        let started = ContinuousClock.now
        var refusals: [BrokerError] = []
        for index in 0..<200 {
            do {
                _ = try await client.token(account: "api", scope: "s\(index)")
            } catch let error as BrokerError {
                refusals.append(error)
            }
        }
        let narrowed = idp.refreshCalls.count - 1
        let elapsed = ContinuousClock.now - started
        #expect(narrowed <= 64, "no more than the account's cache of scoped tokens")
        // The burst of one caller's budget, and one more for every 6 s the loop took.
        let refilled = Int(elapsed / .seconds(6))
        #expect(narrowed >= 10 && narrowed <= 10 + refilled, "\(narrowed) refreshes in \(elapsed)")
        #expect(refusals.count == 200 - narrowed)
        #expect(refusals.allSatisfy { $0.code == .busy && ($0.retryAfterMs ?? 0) > 0 })
        #expect(ContinuousClock.now - started < .seconds(30), "every refusal was answered at once")
        #expect(idp.rejectedReuse == 0)
        await idp.shutdown()
    }
}
