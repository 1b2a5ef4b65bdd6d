/// A failure that repeats while something is down (the broker, the IdP) is told on stderr once
/// when it begins and once when it ends, not at every retry.
struct OutageReport {
    /// Whether the failure was told and has not ended since.
    private(set) var ongoing = false

    /// A try failed: `line` is written when this begins an outage.
    mutating func failed(_ line: @autoclosure () -> String) {
        if !ongoing { StandardStream.error.write("brokerctl: \(line())\n") }
        ongoing = true
    }

    /// A try succeeded: `line` is written when this ends an outage.
    mutating func succeeded(_ line: @autoclosure () -> String) {
        if ongoing { StandardStream.error.write("brokerctl: \(line())\n") }
        ongoing = false
    }
}
