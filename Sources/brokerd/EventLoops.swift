import FoundationEssentials
import NIOCore

/// How many event-loop threads serve the socket and the IdP connections (NIO's process-wide
/// singleton group): `TOKENBROKER_EVENT_LOOPS`, a whole number from 1 to 64, else `standard`.
enum EventLoops {
    static let variable = "TOKENBROKER_EVENT_LOOPS"
    static let allowed = 1...64
    /// Two loops: on the 2-core machines measured (`bench/run`), two served cached tokens at 64
    /// connections faster and with a lower tail than one, and as fast at one connection; a
    /// per-user broker needs no more, and every loop costs memory.
    static let standard = 2

    /// The count `environment` asks for; throws if the variable is set to anything but a whole
    /// number in `allowed`.
    static func count(environment: [String: String]) throws -> Int {
        guard let text = environment[variable] else { return standard }
        guard text.utf8.count <= 2, let count = Int(text), allowed.contains(count) else {
            throw EventLoopsError(
                description: "\(variable) must be a whole number from \(allowed.lowerBound) to \(allowed.upperBound)")
        }
        return count
    }

    /// Sizes NIO's singleton group; must run before anything uses that group, and only once.
    static func configure(environment: [String: String]) throws {
        NIOSingletons.groupLoopCountSuggestion = try count(environment: environment)
    }
}

/// `TOKENBROKER_EVENT_LOOPS` holds something brokerd cannot use (its value is not repeated).
struct EventLoopsError: Error, CustomStringConvertible {
    let description: String
}
