import BrokerProtocol
import Foundation
import TestSupport
import Testing

@testable import BrokerCore

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
}
