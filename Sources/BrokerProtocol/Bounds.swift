import FoundationEssentials

/// Ranges for numbers that come from outside (clients, IdPs, helpers, config files, old
/// vaults), and conversions that saturate instead of trapping. A `Double` is checked here
/// before it becomes an `Int`, a `Duration` or a date.
public enum Bounds {
    /// The longest lifetime the broker believes: a longer `expires_in` means "a long time",
    /// and is cut to this (10 years).
    public static let maximumLifetime: TimeInterval = 10 * 365 * 24 * 3600

    /// A lifetime in seconds from outside: `nil` when it is not finite or is negative,
    /// otherwise at most `maximumLifetime`.
    public static func lifetime(_ seconds: Double) -> TimeInterval? {
        guard seconds.isFinite, seconds >= 0 else { return nil }
        return min(seconds, maximumLifetime)
    }

    /// `seconds` rounded down to a whole number, saturating at ±`maximumLifetime` (so a
    /// date from an old vault can always be shown).
    public static func wholeSeconds(_ seconds: Double) -> Int {
        Int(clamp(seconds, to: maximumLifetime).rounded(.down))
    }

    /// `seconds` in whole milliseconds, rounded up, saturating at ±`maximumLifetime`.
    public static func milliseconds(_ seconds: Double) -> Int {
        Int((clamp(seconds, to: maximumLifetime) * 1000).rounded(.up))
    }

    /// A count from a setting, within `range`; NaN gives the lower bound.
    public static func count(_ value: Double, in range: ClosedRange<Int>) -> Int {
        guard !value.isNaN else { return range.lowerBound }
        return Int(min(max(value, Double(range.lowerBound)), Double(range.upperBound)))
    }

    /// `date` moved into `now ± maximumLifetime`: a date no input may lie outside.
    public static func date(_ date: Date, around now: Date) -> Date {
        let offset = clamp(date.timeIntervalSince(now), to: maximumLifetime)
        return now.addingTimeInterval(offset)
    }

    /// `value` within `-limit...limit`; NaN becomes 0.
    private static func clamp(_ value: Double, to limit: Double) -> Double {
        value.isNaN ? 0 : min(max(value, -limit), limit)
    }
}
