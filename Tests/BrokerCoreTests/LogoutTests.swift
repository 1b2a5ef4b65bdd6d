@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// `logout`: revoke at the IdP where the provider can (RFC 7009), then discard every token and
/// refresh credential; refused while the IdP is unreachable unless forced; silent afterwards
/// until new tokens arrive.
@Suite struct LogoutTests {
    typealias Rig = FaultInjectionTests.Rig

    /// The account `api` as the vault on disk holds it now.
    static func stored(_ rig: Rig) throws -> AccountRecord {
        try #require(try rig.harness.vaultCopy()?.accounts.first { $0.name == "api" })
    }

    @Test(arguments: [FaultInjectionTests.RevocationSource.configured, .discovered])
    func logoutRevokesDiscardsAndStaysSilent(source: FaultInjectionTests.RevocationSource) async throws {
        let rig = try await Rig(settings: FaultInjectionTests.settings, revocation: source)
        defer { Task { await rig.shutdown() } }

        let result = try await rig.broker.logout(account: "api", force: false)
        #expect(result == LogoutResult(account: "api", state: "logged_out", revoked: true))
        #expect(rig.idp.revocations.map(\.token) == ["rt-0"])
        #expect(rig.idp.revocations.first?.hint == "refresh_token")
        #expect(rig.idp.revocations.first?.clientID == rig.idp.clientID)
        #expect(try await rig.state() == "logged_out")

        // Nothing is served, and the vault no longer holds any token or refresh credential.
        let refused = await #expect(throws: BrokerError.self) { try await rig.broker.token(account: "api", minTTL: 0) }
        #expect(refused?.code == .needsLogin)
        #expect(refused?.message.contains("logged out") == true)
        let record = try Self.stored(rig)
        #expect(record.loggedOut == true)
        #expect(record.token == nil && record.secrets.refreshToken == nil && record.secrets.refreshURL == nil)
        #expect(record.provider.kind == "oauth2", "the account and its settings stay")

        // Three simulated days: no refresh is attempted, no second logout reaches the IdP.
        _ = await rig.run(for: 3 * 86_400, step: 600, calls: { rig.idp.callCount })
        #expect(rig.idp.callCount == 0)
        #expect(try await rig.broker.logout(account: "api", force: false).revoked == false)
        #expect(rig.idp.revocations.count == 1)
        #expect(try await rig.state() == "logged_out")

        // The revoked refresh token is dead at the IdP; new tokens bring the account back.
        _ = try await rig.broker.setTokens(
            account: "api", tokens: TokenSet(accessToken: "at-new", expiresIn: 3600, refreshToken: "rt-new"))
        #expect(try await rig.state() == "valid")
        #expect(try await rig.broker.token(account: "api", minTTL: 30).result.accessToken == "at-new")

        let seen = await FaultInjectionTests.collect(rig.events, of: rig.broker.events)
        #expect(seen.filter { $0 == .loggedOut }.count == 1, "\(seen)")
    }

    @Test func whileTheIdPIsDownLogoutIsRefusedUnlessForced() async throws {
        let rig = try await Rig(settings: FaultInjectionTests.settings, revocation: .configured)
        defer { Task { await rig.shutdown() } }
        rig.idp.setBehavior(.status(503, retryAfter: 20))

        let refused = await #expect(throws: BrokerError.self) {
            try await rig.broker.logout(account: "api", force: false)
        }
        #expect(refused?.code == .unavailable)
        #expect(refused?.retryAfterMs == 20_000)
        #expect(refused?.message.contains("--force") == true)
        // Nothing was discarded: the token is still served and the refresh token still stored.
        #expect(try await rig.state() == "valid")
        #expect(try await rig.broker.token(account: "api", minTTL: 30).result.accessToken == "at-old")
        #expect(try Self.stored(rig).secrets.refreshToken == "rt-0")
        #expect(try await rig.broker.status(account: "api")[0].nextRefreshAt != nil, "still scheduled")

        let forced = try await rig.broker.logout(account: "api", force: true)
        #expect(forced == LogoutResult(account: "api", state: "logged_out", revoked: false))
        #expect(rig.idp.revocations.count == 2)
        #expect(try Self.stored(rig).secrets.refreshToken == nil)
        let seen = await FaultInjectionTests.collect(rig.events, of: rig.broker.events)
        #expect(seen.filter { $0 == .loggedOut }.count == 1, "\(seen)")
    }

    /// An IdP that answers but will not revoke (here it no longer knows the client) leaves the
    /// credential alive: the logout is refused without a retry hint, and only `force` discards.
    @Test func aRefusedRevocationNeedsForce() async throws {
        let rig = try await Rig(settings: FaultInjectionTests.settings, revocation: .configured)
        defer { Task { await rig.shutdown() } }
        rig.idp.setBehavior(.status(401, retryAfter: nil))
        let refused = await #expect(throws: BrokerError.self) {
            try await rig.broker.logout(account: "api", force: false)
        }
        #expect(refused?.code == .unavailable)
        #expect(refused?.retryAfterMs == nil, "retrying will not help")
        #expect(try await rig.state() == "valid")
        #expect(try await rig.broker.logout(account: "api", force: true).revoked == false)
        #expect(try await rig.state() == "logged_out")
    }

    /// While a logout waits for the IdP, the account cannot be changed or removed under it.
    @Test(.timeLimit(.minutes(5))) func aLogoutUnderWayHoldsTheAccount() async throws {
        // The revocation's answer is held until every change has been tried, however long that
        // takes on a loaded machine: the broker must not give up on it meanwhile.
        var settings = FaultInjectionTests.settings
        settings.requestTimeout = 60
        let rig = try await Rig(settings: settings, revocation: .configured)
        defer { Task { await rig.shutdown() } }
        let revocation = rig.idp.holdRevocations()
        defer { revocation.open() }
        let logout = Task { try await rig.broker.logout(account: "api", force: false) }
        await revocation.holding(1)
        #expect(rig.idp.revocations.count == 1)
        for change in ["set_tokens", "remove", "logout", "refresh"] {
            let refused = await #expect(throws: BrokerError.self, "\(change)") {
                switch change {
                case "set_tokens":
                    _ = try await rig.broker.setTokens(account: "api", tokens: TokenSet(refreshToken: "rt-x"))
                case "remove": _ = try await rig.broker.remove(account: "api")
                case "logout": _ = try await rig.broker.logout(account: "api", force: true)
                default: _ = try await rig.broker.refreshNow(account: "api")
                }
            }
            #expect(refused?.code == .unavailable, "\(change)")
        }
        revocation.open()
        #expect(try await logout.value.revoked)
        #expect(rig.idp.callCount == 0, "no refresh started during the logout")
        let seen = await FaultInjectionTests.collect(rig.events, of: rig.broker.events)
        #expect(seen.filter { $0 == .loggedOut }.count == 1, "\(seen)")
    }

    /// Providers without revocation (here an oauth2 IdP that names no revocation endpoint, and a
    /// static account) log out locally without any IdP call.
    @Test func withoutRevocationLogoutIsLocal() async throws {
        let rig = try await Rig(settings: FaultInjectionTests.settings)
        defer { Task { await rig.shutdown() } }
        _ = try await rig.broker.add(
            account: "pushed", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "st", expiresIn: 600))
        #expect(try await rig.broker.logout(account: "api", force: false).revoked == false)
        #expect(try await rig.broker.logout(account: "pushed", force: false).revoked == false)
        #expect(rig.idp.revocations.isEmpty && rig.idp.callCount == 0)
        #expect(try await rig.broker.status(account: nil).map(\.state) == ["logged_out", "logged_out"])
        // Each says what restores it: here a pushed refresh token for oauth2 (its IdP offers no
        // sign-in endpoint), a pushed access token for the static account.
        for (account, advice) in [
            (
                "api",
                #"push a new refresh_token with brokerctl set-tokens api (op set_tokens), which reads {"refresh_token": "#
                    + "...} as JSON; its IdP offers no sign-in endpoint (brokerctl update api --authorization-endpoint "
                    + "URL or --device-authorization-endpoint URL adds one)"
            ),
            (
                "pushed",
                "push a new access_token with brokerctl set-tokens pushed (op set_tokens), which reads "
                    + #"{"access_token": ...} as JSON"#
            ),
        ] {
            let refused = await #expect(throws: BrokerError.self) {
                try await rig.broker.token(account: account, minTTL: 0)
            }
            #expect(refused?.code == .needsLogin)
            #expect(refused?.message == "\(account) is logged out; \(advice)")
        }
        let unknown = await #expect(throws: BrokerError.self) {
            try await rig.broker.logout(account: "nobody", force: false)
        }
        #expect(unknown?.code == .notFound)
    }

    /// A logged-out account survives a restart as logged out.
    @Test func loggedOutSurvivesARestart() async throws {
        let rig = try await Rig(settings: FaultInjectionTests.settings)
        defer { Task { await rig.shutdown() } }
        _ = try await rig.broker.logout(account: "api", force: false)
        let restarted = try rig.harness.restart()
        #expect(try await restarted.status(account: "api")[0].state == "logged_out")
        #expect(await restarted.runDueRefreshes() == nil, "nothing scheduled")
    }
}
