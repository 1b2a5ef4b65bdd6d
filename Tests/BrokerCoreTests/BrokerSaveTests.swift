@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The broker saves only the accounts that changed; a change whose save failed is not
/// forgotten but written with the next save, as when every save wrote every account.
@Suite struct BrokerSaveTests {
    @Test func aChangeWhoseSaveFailedIsWrittenWithTheNextSave() async throws {
        try await BrokerHarness.run { h in
            let pushed = { (token: String) in TokenSet(accessToken: token, expiresIn: 3600) }
            _ = try await h.broker.add(account: "a", provider: ProviderSpec(kind: "static"), tokens: pushed("a-1"))
            // The vault's first save was a snapshot; a directory where its log goes makes the next save fail.
            let log = h.vaultPath + ".log"
            try FileManager.default.createDirectory(atPath: log + "/in-the-way", withIntermediateDirectories: true)
            let failed = await #expect(throws: BrokerError.self) {
                try await h.broker.setTokens(account: "a", tokens: pushed("a-2"))
            }
            #expect(failed?.code == .internal)
            #expect(h.logs.all.contains { $0.contains("cannot save the vault") })
            try FileManager.default.removeItem(atPath: log)
            #expect(try h.vaultCopy()?.accounts.first?.token?.value.text == "a-1")

            _ = try await h.broker.add(account: "b", provider: ProviderSpec(kind: "static"), tokens: pushed("b-1"))
            let stored = try #require(try h.vaultCopy()?.accounts)
            #expect(stored.map(\.name) == ["a", "b"])
            #expect(stored.first?.token?.value.text == "a-2", "the change that failed to save was saved with the next")
        }
    }

    /// protocol/VAULT.md, "Room for the next records": a rotation whose record cannot be written
    /// (larger than what is left of the reserve on a full disk) keeps its tokens in memory,
    /// serves none of them, starts no other refresh, and is saved by the retry of the save.
    @Test(.enabled(if: getuid() == 0, "mounts a tmpfs, as root"))
    func aRotationWhoseSaveFailedServesNothingUnsavedAndIsSavedAgainNotRefreshedAgain() async throws {
        let directory = try TemporaryDirectory()
        let disk: SmallTmpfs
        do {
            disk = try SmallTmpfs(at: directory.file("state"), kibibytes: 2048)
        } catch {
            directory.remove()
            throw error
        }
        defer {
            disk.unmount()
            directory.remove()
        }
        var settings = BrokerSettings()
        (settings.backoffBase, settings.backoffCap) = (10, 10)
        try await BrokerHarness.run(settings: settings, stateDirectory: disk.path) { h in
            try await h.addWithValidToken()
            _ = try await h.broker.refreshNow(account: "api")
            let saved = try await h.broker.token(account: "api", minTTL: 0).result.accessToken
            // A record longer than the reserve (and its last page) by far.
            h.idp.padAccessTokens(by: Vault.reserveLength + 32 * 1024)
            try disk.fill()

            await #expect(throws: BrokerError.self) { try await h.broker.refreshNow(account: "api") }
            #expect(h.idp.refreshCalls.count == 2)
            let unsaved = try await h.state()
            #expect(unsaved.state == "degraded")
            #expect(unsaved.lastError?.message.contains("\(h.vaultPath).log: No space left on device") == true)
            #expect(try await h.broker.token(account: "api", minTTL: 0).result.accessToken == saved)
            await #expect(throws: BrokerError.self) { try await h.broker.refreshNow(account: "api") }
            #expect(h.idp.refreshCalls.count == 2, "no refresh while a rotated credential is unsaved")

            disk.free()
            h.clock.advance(by: 10)
            _ = await h.broker.runDueRefreshes()
            let status = try await h.state()
            #expect(status.state == "valid" && status.lastError == nil)
            #expect(h.idp.refreshCalls.count == 2, "saved again, not refreshed again")
            let served = try await h.broker.token(account: "api", minTTL: 0).result.accessToken
            #expect(served == h.idp.issuedAccessTokens.last)
            #expect(try h.vaultCopy()?.accounts.first?.secrets.refreshToken?.text == h.idp.currentRefreshToken)
        }
    }
}
