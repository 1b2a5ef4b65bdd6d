import FoundationEssentials

/// How many narrowed refreshes (`TokenKey`) each caller may start on one account: a token
/// bucket per account and caller uid, `burst` at once and then one every `refill` seconds
/// (docs/limits.md, protocol/PROTOCOL.md section 6). Each refresh rotates the account's refresh
/// token and writes the vault, so without it any caller allowed the account could make the
/// broker call the IdP for every new `scope` it names; with one bucket per uid, another user
/// listed for the account cannot spend the owner's.
public struct NarrowedRefreshBudget: Sendable {
    /// Narrowed refreshes a caller may start on an account at once.
    public static let burst = 10
    /// Seconds until a spent refresh is given back (10 a minute).
    public static let refill: TimeInterval = 6

    private struct Holder: Hashable {
        let account: String
        let uid: UInt32
    }

    /// Refreshes left in each bucket not full, as of `at`; a full bucket is not kept.
    private var buckets: [Holder: (left: Double, at: Date)] = [:]

    /// Every bucket full.
    package init() {}

    /// Takes one refresh from the bucket of `uid` on `account`; `nil` when taken, else the
    /// seconds until one is back.
    package mutating func take(account: String, uid: UInt32, now: Date) -> TimeInterval? {
        let holder = Holder(account: account, uid: uid)
        let left = buckets[holder].map { Self.left($0, now: now) } ?? Double(Self.burst)
        // Buckets that filled up again are dropped, so the memory stays with the recent callers.
        buckets = buckets.filter { Self.left($0.value, now: now) < Double(Self.burst) }
        // Kept as of `now` even when refused, so a wall clock set back delays no refill.
        guard left >= 1 else {
            buckets[holder] = (left, now)
            return (1 - left) * Self.refill
        }
        buckets[holder] = (left - 1, now)
        return nil
    }

    /// Refreshes left in `bucket` at `now`; none come back while the wall clock is before `at`.
    private static func left(_ bucket: (left: Double, at: Date), now: Date) -> Double {
        let elapsed = max(0, now.timeIntervalSince(bucket.at))
        return min(Double(burst), bucket.left + elapsed / refill)
    }
}
