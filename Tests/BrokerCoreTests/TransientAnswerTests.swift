@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// An IdP's hiccup never costs a sign-in: every answer but a refusal of the grant keeps the
/// account serving its token while it retries at its backoff, in state `stale` (a valid token
/// whose refresh fails transiently; `unavailable` once it expires); only `invalid_grant` sends
/// it to `needs_login`. Either way the IdP's error and description are shown. The engine on its
/// test clock, the IdP in process (`FaultInjectionTests.Rig`).
@Suite struct TransientAnswerTests {
    enum Answer: String, CaseIterable, Sendable {
        case serverError400, temporarilyUnavailable400, serviceUnavailable, rateLimited, htmlWith200, hang

        var behavior: OAuth2TestIdP.Behavior {
            switch self {
            case .serverError400: .oauthError(400, error: "server_error", description: "the database is resting")
            case .temporarilyUnavailable400: .oauthError(400, error: "temporarily_unavailable", description: nil)
            case .serviceUnavailable: .status(503, retryAfter: nil)
            case .rateLimited: .status(429, retryAfter: 3)
            case .htmlWith200: .garbage
            case .hang: .hang
            }
        }

        /// What the account's last error and its event say.
        var shown: String {
            switch self {
            case .serverError400: "the token endpoint answered HTTP 400 (server_error: the database is resting)"
            case .temporarilyUnavailable400: "the token endpoint answered HTTP 400 (temporarily_unavailable)"
            case .serviceUnavailable: "the token endpoint answered HTTP 503 (temporarily_unavailable)"
            case .rateLimited: "the token endpoint answered HTTP 429 (temporarily_unavailable)"
            case .htmlWith200: "the token endpoint answered HTTP 200 without a usable access_token"
            case .hang: "cannot reach the IdP at"
            }
        }
    }

    /// The IdP's calls, the account's status and the events of the refreshes from the
    /// proactive refresh point (about 75% of the token's hour) on, for `seconds` of the test clock.
    private static func refreshes(_ rig: FaultInjectionTests.Rig, for seconds: TimeInterval) async throws -> (
        times: [Date], status: AccountStatus, events: [AccountEvent]
    ) {
        rig.clock.advance(by: 2900)
        let times = await rig.run(for: seconds, step: 0.5) { rig.callCount }
        let status = try #require(try await rig.broker.status(account: "api").first)
        return (times, status, await events(rig))
    }

    /// The events the rig's subscription already got, read up to a marker published after them.
    private static func events(_ rig: FaultInjectionTests.Rig) async -> [AccountEvent] {
        let marker = AccountName(known: "end-of-events")
        rig.broker.events.publish(AccountEvent(kind: .removed, account: marker, at: Date(), state: nil))
        var seen: [AccountEvent] = []
        do {
            for try await event in rig.events {
                if event.account == marker { break }
                seen.append(event)
            }
        } catch {}
        return seen
    }

    @Test(arguments: Answer.allCases)
    func aTransientAnswerKeepsServingAndRetries(answer: Answer) async throws {
        let rig = try await FaultInjectionTests.Rig(settings: FaultInjectionTests.settings)
        defer { Task { await rig.shutdown() } }
        rig.idp.setBehavior(answer.behavior)

        let (times, status, events) = try await Self.refreshes(rig, for: 60)

        #expect(status.state == "stale", "not needs_login: the credential is kept")
        #expect(status.lastError?.code == "unavailable")
        let message = try #require(status.lastError?.message)
        #expect(message.hasPrefix(answer.shown), "\(message)")
        #expect(try await rig.broker.token(account: "api", minTTL: 30).result.accessToken == "at-old")
        #expect(times.count >= 2, "retried at the backoff: \(times.count) calls")
        if answer == .rateLimited {
            let gaps = zip(times.dropFirst(), times).map { $0.timeIntervalSince($1) }
            #expect(gaps.allSatisfy { $0 >= 3 }, "no retry before Retry-After's 3 s: \(gaps)")
        }
        #expect(!events.contains { $0.kind == .needsLogin })
        let failed = events.filter { $0.kind == .refreshFailed }
        #expect(failed.count == 1)
        #expect(failed.first?.message?.hasPrefix(answer.shown) == true, "\(failed)")
    }

    @Test func invalidGrantStopsTheAccountAndShowsTheIdPsDescription() async throws {
        let rig = try await FaultInjectionTests.Rig(settings: FaultInjectionTests.settings)
        defer { Task { await rig.shutdown() } }
        rig.idp.setBehavior(.oauthError(400, error: "invalid_grant", description: "unknown refresh token"))

        let (times, status, events) = try await Self.refreshes(rig, for: 60)

        let shown = "the token endpoint refused the refresh: HTTP 400 (invalid_grant: unknown refresh token)"
        #expect(status.state == "needs_login")
        #expect(status.lastError?.code == "needs_login")
        #expect(status.lastError?.message == shown)
        #expect(times.count == 1, "a denial is final")
        let refused = await #expect(throws: BrokerError.self) { try await rig.broker.token(account: "api", minTTL: 30) }
        #expect(refused?.code == .needsLogin)
        #expect(events.filter { $0.kind == .needsLogin }.map(\.message) == [shown])
        #expect(!events.contains { $0.kind == .refreshFailed })
    }

    /// A client the IdP does not accept is still told apart from a refused grant, by the code.
    @Test func invalidClientStopsTheAccountAndNamesTheClientSettings() async throws {
        let rig = try await FaultInjectionTests.Rig(settings: FaultInjectionTests.settings)
        defer { Task { await rig.shutdown() } }
        rig.idp.setBehavior(.oauthError(401, error: "invalid_client", description: "no such client"))

        // As long as the other cases: the scheduled refresh falls anywhere in its spread.
        let (times, status, _) = try await Self.refreshes(rig, for: 60)
        #expect(times.count == 1, "a denial is final")

        #expect(status.state == "needs_login")
        #expect(status.lastError?.message.hasSuffix("HTTP 401 (invalid_client: no such client)") == true)
        let refused = await #expect(throws: BrokerError.self) { try await rig.broker.token(account: "api", minTTL: 30) }
        #expect(refused?.message.contains("--client-id") == true, "\(refused?.message ?? "")")
    }
}
