import FoundationEssentials

/// Wall-clock time, injectable so tests can jump it. Expiry is always judged by it.
public protocol WallClock: Sendable {
    func now() -> Date
}

/// The real system clock.
public struct SystemClock: WallClock {
    public init() {}

    public func now() -> Date { Date() }
}
