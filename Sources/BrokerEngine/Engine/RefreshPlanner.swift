import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// Decides when an account refreshes next: proactively before expiry, and with
/// capped, fully jittered exponential backoff after transient failures.
package struct RefreshPlanner: Sendable {
    package let settings: BrokerSettings

    /// The proactive refresh point for `token`: when about `refreshFraction` of its lifetime
    /// remains (± jitter), never later than `refreshFloor` before expiry, and before a
    /// refresh token with an expiry lapses.
    package func nextRefresh(token: AccessToken?, refreshExpiresAt: Date?, now: Date) -> Date {
        guard let token else { return now }
        let lifetime = max(1, token.expiresAt.timeIntervalSince(token.obtainedAt))
        let jitter = Double.random(in: -settings.refreshJitter...settings.refreshJitter)
        let margin = max(lifetime * (settings.refreshFraction + jitter), min(settings.refreshFloor, lifetime / 2))
        var due = token.expiresAt.addingTimeInterval(-margin)
        if let refreshExpiresAt {
            let refreshLifetime = max(1, refreshExpiresAt.timeIntervalSince(token.obtainedAt))
            due = min(due, refreshExpiresAt.addingTimeInterval(-refreshLifetime * settings.refreshFraction))
        }
        return max(due, now)
    }

    /// Delay before retry number `failures` (1-based): full jitter over a capped exponential,
    /// never shorter than the IdP's `Retry-After`.
    package func backoff(failures: Int, retryAfter: TimeInterval?) -> TimeInterval {
        // The exponent stops at 2^40, so the product stays finite (no NaN from 0 * infinity).
        let ceiling = min(settings.backoffCap, settings.backoffBase * pow(2, Double(min(max(0, failures - 1), 40))))
        let jittered = Double.random(in: 0...ceiling)
        return max(jittered, min(retryAfter ?? 0, settings.backoffCap))
    }

    /// How soon, within a backoff of `backoff` seconds, a client's request may try the IdP
    /// again: after `outageProbeInterval`, or the IdP's `Retry-After` when that is longer
    /// (cut to `backoffCap`); never later than the backoff's end.
    package func probeDelay(backoff: TimeInterval, retryAfter: TimeInterval?) -> TimeInterval {
        min(backoff, max(settings.outageProbeInterval, min(retryAfter ?? 0, settings.backoffCap)))
    }
}
