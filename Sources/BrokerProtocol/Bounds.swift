import FoundationEssentials

/// Ranges for numbers that come from outside (clients, IdPs, helpers, config files, old
/// vaults), and conversions that saturate instead of trapping. A `Double` is checked here
/// before it becomes an `Int`, a `Duration` or a date.
public enum Bounds {
    /// The longest lifetime the broker believes: a longer `expires_in` means "a long time",
    /// and is cut to this (10 years). `min_ttl` may not ask for more.
    public static let maximumLifetime: TimeInterval = 10 * 365 * 24 * 3600

    /// The dates RFC 3339 can write: 1970-01-01 to 9999-12-31T23:59:59Z.
    public static let representableDates = Date(timeIntervalSince1970: 0)...Date(timeIntervalSince1970: 253_402_300_799)

    /// Longest span any conversion below passes on unchanged (more than the representable dates span).
    private static let maximumSpan: Double = 1e12

    /// A lifetime in seconds from outside: `nil` when it is not finite or is negative,
    /// otherwise at most `maximumLifetime`.
    public static func lifetime(_ seconds: Double) -> TimeInterval? {
        guard seconds.isFinite, seconds >= 0 else { return nil }
        return min(seconds, maximumLifetime)
    }

    /// `date` moved into `representableDates`, so it can be shown, sent and compared.
    public static func date(_ date: Date) -> Date {
        guard !date.timeIntervalSinceReferenceDate.isNaN else { return representableDates.lowerBound }
        return min(max(date, representableDates.lowerBound), representableDates.upperBound)
    }

    /// `seconds` rounded down to a whole number, saturating instead of trapping (NaN is 0).
    public static func wholeSeconds(_ seconds: Double) -> Int {
        Int(clamp(seconds).rounded(.down))
    }

    /// `seconds` in whole milliseconds, rounded up, saturating instead of trapping (NaN is 0).
    public static func milliseconds(_ seconds: Double) -> Int {
        Int((clamp(seconds) * 1000).rounded(.up))
    }

    /// A count from a setting, within `range`; NaN gives the lower bound.
    public static func count(_ value: Double, in range: ClosedRange<Int>) -> Int {
        guard !value.isNaN else { return range.lowerBound }
        return Int(min(max(value, Double(range.lowerBound)), Double(range.upperBound)))
    }

    /// `value` within `±maximumSpan`; NaN becomes 0.
    private static func clamp(_ value: Double) -> Double {
        value.isNaN ? 0 : min(max(value, -maximumSpan), maximumSpan)
    }
}
