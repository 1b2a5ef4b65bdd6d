@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// docs/configuration.md, `[broker]`: refresh when about 25% of the lifetime remains (± jitter), never later
/// than a floor before expiry, before a refresh token lapses; capped, jittered backoff.
@Suite struct RefreshPlannerTests {
    static let now = Date(timeIntervalSince1970: 1_795_422_600)
    static let samples = 300

    private func token(lifetime: TimeInterval, obtainedAt: Date = now) -> AccessToken {
        AccessToken(
            value: SecretBytes("at"), type: "Bearer", expiresAt: obtainedAt.addingTimeInterval(lifetime),
            obtainedAt: obtainedAt,
            idToken: nil, scope: nil)
    }

    /// Seconds before expiry at which each of `samples` plans refreshes.
    private func margins(_ planner: RefreshPlanner, lifetime: TimeInterval, refreshExpiresAt: Date? = nil) -> [Double] {
        let token = token(lifetime: lifetime)
        return (0..<Self.samples).map { _ in
            token.expiresAt.timeIntervalSince(
                planner.nextRefresh(token: token, refreshExpiresAt: refreshExpiresAt, now: Self.now))
        }
    }

    @Test func refreshesWhenAQuarterOfTheLifetimeRemainsWithJitter() {
        let planner = RefreshPlanner(settings: BrokerSettings())
        let margins = margins(planner, lifetime: 3600)
        // 25% ± 5% of 3600 s: between 720 s and 1080 s before expiry.
        #expect(margins.allSatisfy { $0 >= 720 - 1e-6 && $0 <= 1080 + 1e-6 }, "\(margins.min()!)...\(margins.max()!)")
        #expect(margins.max()! - margins.min()! > 60, "a thousand accounts must not refresh in the same second")
    }

    @Test func withoutJitterTheRefreshPointIsExact() {
        var settings = BrokerSettings()
        settings.refreshJitter = 0
        let planner = RefreshPlanner(settings: settings)
        #expect(margins(planner, lifetime: 3600).allSatisfy { abs($0 - 900) < 1e-6 })
        settings.refreshFraction = 0.5
        #expect(margins(RefreshPlanner(settings: settings), lifetime: 3600).allSatisfy { abs($0 - 1800) < 1e-6 })
    }

    @Test func neverLaterThanTheFloorBeforeExpiry() {
        let planner = RefreshPlanner(settings: BrokerSettings())  // floor 60 s
        // 30% of 150 s is 45 s, less than the 60 s floor: the floor wins.
        #expect(margins(planner, lifetime: 150).allSatisfy { abs($0 - 60) < 1e-6 })

        var settings = BrokerSettings()
        settings.refreshFloor = 300
        // 20..30% of 1000 s is 200..300 s, so the 300 s floor always applies.
        #expect(margins(RefreshPlanner(settings: settings), lifetime: 1000).allSatisfy { abs($0 - 300) < 1e-6 })
        // With a 3600 s lifetime, 720..1080 s already exceeds the floor.
        #expect(margins(RefreshPlanner(settings: settings), lifetime: 3600).allSatisfy { $0 >= 720 - 1e-6 })
    }

    @Test func theFloorIsCappedAtHalfTheLifetime() {
        let planner = RefreshPlanner(settings: BrokerSettings())  // floor 60 s
        // A 100 s token cannot be refreshed 60 s before expiry forever: half its lifetime, 50 s.
        #expect(margins(planner, lifetime: 100).allSatisfy { abs($0 - 50) < 1e-6 })
    }

    @Test func refreshesBeforeTheRefreshTokenLapses() {
        let planner = RefreshPlanner(settings: BrokerSettings())
        // The access token lives an hour but the refresh token only 1000 s: refresh when 25% of
        // the refresh token's life remains, 750 s after it was obtained.
        let refreshExpiry = Self.now.addingTimeInterval(1000)
        let token = token(lifetime: 3600)
        for _ in 0..<Self.samples {
            let due = planner.nextRefresh(token: token, refreshExpiresAt: refreshExpiry, now: Self.now)
            #expect(due < refreshExpiry)
            #expect(abs(due.timeIntervalSince(Self.now) - 750) < 1e-6)
        }
        // A refresh token that outlives the access token changes nothing.
        let late = Self.now.addingTimeInterval(86_400)
        #expect(
            margins(planner, lifetime: 3600, refreshExpiresAt: late).allSatisfy {
                $0 >= 720 - 1e-6 && $0 <= 1080 + 1e-6
            })
    }

    @Test func dueAtOnceWithoutATokenOrWhenTheRefreshPointHasPassed() {
        let planner = RefreshPlanner(settings: BrokerSettings())
        #expect(planner.nextRefresh(token: nil, refreshExpiresAt: nil, now: Self.now) == Self.now)
        let expired = token(lifetime: 3600, obtainedAt: Self.now.addingTimeInterval(-7200))
        #expect(planner.nextRefresh(token: expired, refreshExpiresAt: nil, now: Self.now) == Self.now)
        let almostExpired = token(lifetime: 3600, obtainedAt: Self.now.addingTimeInterval(-3590))
        #expect(planner.nextRefresh(token: almostExpired, refreshExpiresAt: nil, now: Self.now) == Self.now)
        let lapsedRefresh = Self.now.addingTimeInterval(-1)
        let olderToken = token(lifetime: 3600, obtainedAt: Self.now.addingTimeInterval(-60))
        #expect(planner.nextRefresh(token: olderToken, refreshExpiresAt: lapsedRefresh, now: Self.now) == Self.now)
    }

    @Test func backoffGrowsExponentiallyWithJitterUpToTheCap() {
        let planner = RefreshPlanner(settings: BrokerSettings())  // base 1 s, cap 300 s
        for failures in 1...30 {
            let ceiling = min(300, pow(2, Double(failures - 1)))
            let delays = (0..<Self.samples).map { _ in planner.backoff(failures: failures, retryAfter: nil) }
            #expect(
                delays.allSatisfy { $0 > 0 && $0 <= ceiling },
                "failures \(failures): \(delays.min()!)...\(delays.max()!)")
            if failures >= 3 {
                #expect(delays.max()! - delays.min()! > 0, "failures \(failures): no jitter")
            }
        }
        let capped = (0..<Self.samples).map { _ in planner.backoff(failures: 10_000, retryAfter: nil) }
        #expect(capped.allSatisfy { $0.isFinite && $0 > 0 && $0 <= 300 })
        #expect(capped.max()! > 150, "after many failures the delay reaches the upper half of the cap")
    }

    @Test func backoffHonoursRetryAfterUpToTheCap() {
        let planner = RefreshPlanner(settings: BrokerSettings())
        for _ in 0..<Self.samples {
            let delay = planner.backoff(failures: 1, retryAfter: 120)
            #expect(delay >= 120 && delay <= 300)
        }
        // A short Retry-After does not shorten the backoff.
        for _ in 0..<Self.samples {
            let delay = planner.backoff(failures: 8, retryAfter: 1)
            #expect(delay >= 1 && delay <= 128)
        }
        // An absurd Retry-After is capped so an account is not parked for days.
        for _ in 0..<Self.samples {
            #expect(planner.backoff(failures: 1, retryAfter: 1_000_000) == 300)
        }
    }

    /// docs/limits.md: during a backoff a client's request may try again after
    /// `outage_probe_interval`, or the IdP's longer `Retry-After`, and never after the backoff.
    @Test func aClientMayProbeSoonerThanTheBackoffButNotBeforeRetryAfter() {
        let planner = RefreshPlanner(settings: BrokerSettings())  // probe interval 2 s, cap 300 s
        #expect(planner.probeDelay(backoff: 60, retryAfter: nil) == 2)
        #expect(planner.probeDelay(backoff: 60, retryAfter: 1) == 2)
        #expect(planner.probeDelay(backoff: 60, retryAfter: 15) == 15)
        #expect(planner.probeDelay(backoff: 0.5, retryAfter: nil) == 0.5)
        #expect(planner.probeDelay(backoff: 300, retryAfter: 1_000_000) == 300)
    }
}
