@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// A refresh takes the guarded memory its answer needs before it calls the IdP
/// (`SecretArena.Reservation`): the broker runs on an arena with a small budget, and the test
/// spends what is left of it (`Hog`) while the IdP holds its answer, or before the refresh.
@Suite struct AnswerMemoryTests {
    /// The memory the test's arena may map: room for the broker's few secrets and the hog's.
    static let budget = 2 << 20

    /// Secrets stored until the arena can map nothing more, in every slot size, so that no
    /// free slot is left either; released when it goes.
    final class Hog: Sendable {
        let secrets: [SecretBytes]

        init() {
            var secrets: [SecretBytes] = []
            for size in SecretArena.slotSizes.reversed() {
                let bytes = [UInt8](repeating: 0x68, count: size)
                while let secret = bytes.withUnsafeBytes({ try? SecretBytes(bytes: $0) }) { secrets.append(secret) }
            }
            self.secrets = secrets
        }
    }

    /// Whether the vault on disk holds `refreshToken` as the account's; compared here, not in
    /// `#expect`, whose failure message would print the tokens (and the IdP's calls their
    /// client secret).
    static func saves(_ refreshToken: String?, in h: BrokerHarness) throws -> Bool {
        try h.vaultCopy()?.accounts.first?.secrets.refreshToken?.text == refreshToken
    }

    /// Runs `body` on a broker whose secrets come from an arena of `budget` bytes.
    static func withSmallArena(_ body: (BrokerHarness) async throws -> Void) async throws {
        try await SecretArena.$current.withValue(SecretArena(pages: GuardedPages(budget: budget))) {
            try await BrokerHarness.run(body)
        }
    }

    @Test func aRotationAnsweredAfterMemoryRanOutIsStoredAndSaved() async throws {
        try await Self.withSmallArena { h in
            try await h.addWithValidToken()
            let answers = h.idp.holdAnswers()
            let refreshing = Task { try await h.broker.refreshNow(account: "api") }
            await answers.holding(1)
            var hog: Hog? = Hog()
            #expect(throws: BrokerFailure.outOfGuardedMemory, "the arena has nothing left") {
                try [UInt8](repeating: 0x68, count: 32).withUnsafeBytes { bytes throws(BrokerFailure) in
                    try SecretBytes(bytes: bytes)
                }
            }
            answers.open()
            _ = try await refreshing.value
            #expect(try await h.state().state == "valid")
            let served = try await h.broker.token(account: "api", minTTL: 0)
            #expect(served.result.accessToken == h.idp.issuedAccessTokens.last)
            withExtendedLifetime(hog) {}
            hog = nil  // reading the vault takes guarded memory

            let rotated = try #require(h.idp.issuedRefreshTokens.last)
            let calls = h.idp.refreshCalls.count
            #expect(calls == 1)
            #expect(try Self.saves(rotated, in: h), "the rotation is saved")
        }
    }

    @Test func noMemoryForTheAnswerMeansNoIdPCallUntilThereIsSome() async throws {
        try await Self.withSmallArena { h in
            try await h.addWithValidToken()
            var hog: Hog? = Hog()
            await #expect(throws: BrokerError.self) { try await h.broker.refreshNow(account: "api") }
            let calls = h.idp.refreshCalls.count
            #expect(calls == 0, "the IdP was not called")
            let status = try await h.state()
            #expect(status.lastError?.message.contains("out of guarded memory") == true)
            let served = try await h.broker.token(account: "api", minTTL: 0)
            #expect(served.result.accessToken == "at-pushed", "the valid token is still served")
            withExtendedLifetime(hog) {}
            hog = nil  // reading the vault takes guarded memory
            #expect(try Self.saves("rt-0", in: h), "the credential is kept")

            h.clock.advance(by: 300)  // past the backoff of the refusal
            _ = try await h.broker.refreshNow(account: "api")
            let callsLater = h.idp.refreshCalls.count
            #expect(callsLater == 1)
            #expect(try Self.saves(h.idp.issuedRefreshTokens.last, in: h))
        }
    }
}
