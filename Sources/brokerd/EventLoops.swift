import FoundationEssentials
import NIOCore

/// How many event-loop threads serve the socket and the IdP connections (NIO's process-wide
/// singleton group): `TOKENBROKER_EVENT_LOOPS`, a whole number from 1 to 64, else `standard`.
enum EventLoops {
    static let variable = "TOKENBROKER_EVENT_LOOPS"
    static let allowed = 1...64
    /// One loop: on 2 cores (`bench/run`), one loop served cached tokens at 64 connections with
    /// a lower p99 than two whenever other work left the machine's cores to the benchmark, for
    /// up to a third fewer requests per second, which a per-user broker does not need; at one
    /// connection the two were alike.
    static let standard = 1

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
