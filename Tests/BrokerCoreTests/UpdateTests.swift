@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// An account's settings and client secret corrected in place (`update`, and `set_tokens` with
/// a `client_secret`): the refresh token stays, the IdP receives the change at once, and what
/// cannot be changed without sending the credential elsewhere is refused with why.
@Suite struct UpdateTests {
    /// An account whose client secret is wrong: the IdP answers `invalid_client`.
    static func addWithWrongSecret(_ h: BrokerHarness) async throws {
        var provider = h.provider
        provider["client_secret"] = .string("not-the-secret")
        _ = try await h.broker.add(account: "api", provider: provider, tokens: TokenSet(refreshToken: "rt-0"))
        let refused = await #expect(throws: BrokerError.self) { try await h.broker.token(account: "api", minTTL: 30) }
        #expect(refused?.code == .needsLogin)
        #expect(refused?.message.contains("correct the client secret with brokerctl update api --secrets -") == true)
        #expect(try await h.state().adviceCommand == "brokerctl update api --secrets -")
        #expect(h.idp.calls.last?.clientSecret == "not-the-secret")
    }

    @Test func updateCorrectsAWrongClientSecretAndKeepsTheRefreshToken() async throws {
        try await BrokerHarness.run { h in
            try await Self.addWithWrongSecret(h)
            let updated = try await h.broker.update(
                try AccountName("api"), changes: [:], clientSecret: SecretBytes(h.idp.clientSecret))
            #expect([.refreshing, .valid].contains(updated.state), "a refused account refreshes at once")
            let token = try await h.broker.token(account: "api", minTTL: 30)
            #expect(token.result.accessToken == h.idp.issuedAccessTokens.last)
            let call = try #require(h.idp.calls.last)
            #expect(call.clientSecret == h.idp.clientSecret)
            #expect(call.refreshToken == "rt-0", "the refresh token was kept")
            #expect(h.idp.callCount == 2)
            #expect(try await h.state().adviceCommand == nil)
            #expect(try h.vaultCopy()?.accounts.first?.secrets.clientSecret?.text == h.idp.clientSecret)
        }
    }

    @Test func setTokensWithOnlyAClientSecretDoesTheSame() async throws {
        try await BrokerHarness.run { h in
            try await Self.addWithWrongSecret(h)
            var secret = TokenSet()
            secret.clientSecret = h.idp.clientSecret
            _ = try await h.broker.setTokens(account: "api", tokens: secret)
            _ = try await h.broker.token(account: "api", minTTL: 30)
            #expect(h.idp.calls.last?.clientSecret == h.idp.clientSecret)
            #expect(h.idp.calls.last?.refreshToken == "rt-0")
        }
    }

    @Test func updateChecksTheResultAndRefusesToMoveTheCredential() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()
            let api = try AccountName("api")
            await #expect(throws: BrokerFailure.credentialWouldMove(api, move: "changes its client_id")) {
                try await h.broker.update(api, changes: ["client_id": .string("other")], clientSecret: nil)
            }
            await #expect(throws: BrokerFailure.self) {
                try await h.broker.update(api, changes: ["client_auth": .string("bogus")], clientSecret: nil)
            }
            await #expect(throws: BrokerFailure.invalid("nothing to change: give a setting or a client secret")) {
                try await h.broker.update(api, changes: [:], clientSecret: nil)
            }
            // A new scope is used by the next refresh; the token stays until then.
            _ = try await h.broker.update(api, changes: ["scope": .string("read")], clientSecret: nil)
            #expect(try await h.broker.token(account: "api", minTTL: 30).result.accessToken == "at-pushed")
            _ = try await h.broker.refreshNow(api)
            #expect(h.idp.calls.last?.scope == "read")
            _ = try await h.broker.update(api, changes: ["scope": .null], clientSecret: nil)
            _ = try await h.broker.refreshNow(api)
            #expect(h.idp.calls.last?.scope == nil)
            // A static account has nothing to change in place.
            _ = try await h.broker.add(
                account: "st", provider: ProviderSpec(kind: "static"), tokens: TokenSet(accessToken: "s"))
            await #expect(throws: BrokerFailure.self) {
                try await h.broker.update(try AccountName("st"), changes: ["path": .string("/x")], clientSecret: nil)
            }
        }
    }
}
