@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// The lifecycle under IdP failures, with an injected clock: the state reached, what `token`
/// answers before and after the old token expires, how many IdP calls happen and how far
/// apart (backoff, Retry-After), and which events are emitted (each once).
@Suite struct FaultInjectionTests {
    enum Fault: String, CaseIterable, Sendable {
        case timeout, connectionRefused, serverError, rateLimited, malformedJSON, slowPastTotalTimeout, invalidGrant
        /// A sliding account (seed 004) presenting a refresh token that was already used.
        case refreshTokenMismatch

        var isDenial: Bool { self == .invalidGrant || self == .refreshTokenMismatch }
    }

    /// Where an `oauth2` account's `logout` revokes.
    enum RevocationSource: Sendable {
        case none, configured, discovered
    }

    /// The in-process harness's broker, on its test clock, with one account, `api`, whose token
    /// is valid for an hour: `oauth2` against the harness's IdP by default, or `sliding` against
    /// `slidingIdP`.
    struct Rig {
        let harness: BrokerHarness
        let slidingIdP: SlidingTestIdP?
        let events: EventHub.Events

        var idp: OAuth2TestIdP { harness.idp }
        var clock: TestClock { harness.clock }
        var broker: Broker { harness.broker }

        init(
            settings: BrokerSettings, endpoint: String? = nil, sliding: Bool = false,
            revocation: RevocationSource = .none
        ) async throws {
            harness = try await BrokerHarness.start(settings: settings)
            do {
                slidingIdP = sliding ? try await SlidingTestIdP(initialRefreshToken: "rt-0", serving: .inProcess) : nil
            } catch {
                await harness.stop()
                throw error
            }
            events = harness.broker.events.subscribe(accounts: nil)
            let idp = harness.idp
            var provider = ProviderSpec(
                kind: "oauth2",
                ["token_endpoint": .string(endpoint ?? idp.tokenEndpoint), "client_id": .string(idp.clientID)])
            switch revocation {
            case .none: break
            case .configured: provider["revocation_endpoint"] = .string(idp.revocationEndpoint)
            case .discovered: (provider["token_endpoint"], provider["issuer"]) = (nil, .string(idp.issuer))
            }
            if let slidingIdP {
                provider = ProviderSpec(kind: "sliding")
                provider["endpoint"] = .string(slidingIdP.endpoint)
            }
            do {
                _ = try await harness.broker.add(
                    account: "api", provider: provider,
                    tokens: TokenSet(accessToken: "at-old", expiresIn: 3600, refreshToken: "rt-0"))
            } catch {
                await shutdown()
                throw error
            }
        }

        /// Calls the account's IdP received.
        var callCount: Int { slidingIdP?.callCount ?? idp.callCount }

        /// Moves the clock in `step`-second steps for `seconds`, running the scheduler each time;
        /// returns the clock times at which the IdP was called.
        func run(for seconds: TimeInterval, step: TimeInterval, calls: () -> Int) async -> [Date] {
            var times: [Date] = []
            var elapsed: TimeInterval = 0
            while elapsed < seconds {
                clock.advance(by: step)
                elapsed += step
                let before = calls()
                _ = await broker.runDueRefreshes()
                await broker.drain()
                times += Array(repeating: clock.now(), count: calls() - before)
            }
            return times
        }

        func state() async throws -> String { try await broker.status(account: "api")[0].state }

        func shutdown() async {
            await harness.stop()
            await slidingIdP?.shutdown()
        }
    }

    static var settings: BrokerSettings {
        var settings = BrokerSettings()
        settings.requestTimeout = 0.5
        settings.connectTimeout = 0.5
        settings.backoffBase = 1
        settings.backoffCap = 40
        return settings
    }

    /// A loopback address with nothing listening.
    static func closedPortEndpoint() -> String {
        InProcessIdPNetwork.unusedBaseURL() + "/token"
    }

    @Test(arguments: Fault.allCases)
    func lifecycleUnderFault(fault: Fault) async throws {
        let endpoint = fault == .connectionRefused ? Self.closedPortEndpoint() : nil
        let rig = try await Rig(settings: Self.settings, endpoint: endpoint, sliding: fault == .refreshTokenMismatch)
        defer { Task { await rig.shutdown() } }
        let calls = { fault == .connectionRefused ? 0 : rig.callCount }
        switch fault {
        // Both time out at once: in-process time is simulated (`InProcessIdPNetwork`).
        case .timeout: rig.idp.setBehavior(.hang)
        case .connectionRefused: break
        case .serverError: rig.idp.setBehavior(.status(500, retryAfter: nil))
        case .rateLimited: rig.idp.setBehavior(.status(429, retryAfter: 15))
        case .malformedJSON: rig.idp.setBehavior(.garbage)
        case .slowPastTotalTimeout: rig.idp.setDelay(.seconds(2))
        case .invalidGrant, .refreshTokenMismatch:
            _ = try await rig.broker.setTokens(
                account: "api", tokens: TokenSet(accessToken: "at-old", expiresIn: 3600, refreshToken: "rt-burned"))
        }

        // Reach the proactive refresh point (about 75% of the lifetime), then run for 2 simulated minutes.
        rig.clock.advance(by: 2900)
        let times = await rig.run(for: 120, step: 0.5, calls: calls)
        let state = try await rig.state()

        if fault.isDenial {
            #expect(state == "needs_login")
            #expect(times.count == 1, "a denial is final: no retries")
            // Nothing is served for a denied account, neither while the old token is valid nor after.
            let refused = await #expect(throws: BrokerError.self) {
                try await rig.broker.token(account: "api", minTTL: 30)
            }
            #expect(refused?.code == .needsLogin)
            rig.clock.advance(by: 1200)
            let expired = await #expect(throws: BrokerError.self) {
                try await rig.broker.token(account: "api", minTTL: 0)
            }
            #expect(expired?.code == .needsLogin)
            #expect(calls() == times.count, "no IdP call after the denial")
        } else {
            // Transient: the current token is still served while valid; retries back off.
            #expect(state == "stale")
            let served = try await rig.broker.token(account: "api", minTTL: 30)
            #expect(served.result.accessToken == "at-old")
            if fault != .connectionRefused {
                #expect(
                    times.count >= 3 && times.count <= 30, "retries in 2 minutes (240 without backoff): \(times.count)")
                let gaps = zip(times.dropFirst(), times).map { $0.timeIntervalSince($1) }
                #expect(gaps.allSatisfy { $0 <= Self.settings.backoffCap + 1 })
                if fault == .rateLimited {
                    #expect(gaps.allSatisfy { $0 >= 15 }, "Retry-After 15 s honoured: \(gaps)")
                }
            }
            // After the old token expires, token fails fast with unavailable and a retry hint.
            rig.clock.advance(by: 1200)
            let before = calls()
            let error = await #expect(throws: BrokerError.self) {
                try await rig.broker.token(account: "api", minTTL: 30)
            }
            #expect(error?.code == .unavailable)
            #expect(error?.retryAfterMs != nil)
            #expect(calls() <= before + 1, "at most one attempt, no hammering")
            #expect(try await rig.state() == "unavailable")
        }

        // Events: the failure is announced once, however many retries there were.
        let seen = await Self.collect(rig.events, of: rig.broker.events)
        let expected: AccountEvent.Kind = fault.isDenial ? .needsLogin : .refreshFailed
        #expect(seen.first == .added)
        #expect(seen.filter { $0 == expected }.count == 1, "\(seen)")
        #expect(!seen.contains(.refreshed))
    }

    /// The kinds of the events `hub` already delivered to `events`: read up to a marker
    /// published after them (events arrive in the order published).
    static func collect(_ events: EventHub.Events, of hub: EventHub) async -> [AccountEvent.Kind] {
        let marker = AccountName(known: "end-of-collect")
        hub.publish(AccountEvent(kind: .removed, account: marker, at: Date(), state: nil))
        var seen: [AccountEvent.Kind] = []
        do {
            for try await event in events {
                if event.account == marker { break }
                seen.append(event.kind)
            }
        } catch {}
        return seen
    }

    @Test func afterADenialTheAccountStaysQuietWhileOthersRefresh() async throws {
        let rig = try await Rig(settings: Self.settings)
        defer { Task { await rig.shutdown() } }
        let other = try await OAuth2TestIdP(initialRefreshToken: "rt-other", lifetime: 3600, serving: .inProcess)
        _ = try await rig.broker.add(
            account: "other",
            provider: ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(other.tokenEndpoint), "client_id": .string(other.clientID)]),
            tokens: TokenSet(refreshToken: "rt-other"))
        await rig.broker.drain()
        _ = try await rig.broker.setTokens(
            account: "api", tokens: TokenSet(accessToken: "at-old", expiresIn: 3600, refreshToken: "rt-burned"))

        // Ten simulated days in one-hour steps.
        _ = await rig.run(for: 10 * 86_400, step: 3600, calls: { rig.idp.callCount })
        #expect(rig.idp.callCount == 1, "one denied refresh, then silence")
        #expect(try await rig.state() == "needs_login")
        #expect(other.callCount >= 100, "the other account kept refreshing: \(other.callCount)")

        // New tokens bring it back.
        let current = rig.idp.issuedRefreshTokens.last ?? "rt-0"
        _ = try await rig.broker.setTokens(account: "api", tokens: TokenSet(refreshToken: current))
        let token = try await rig.broker.token(account: "api", minTTL: 30)
        #expect(try await rig.state() == "valid")
        #expect(token.result.accessToken == rig.idp.issuedAccessTokens.last)
        await other.shutdown()
    }
}
