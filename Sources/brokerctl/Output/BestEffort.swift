import BrokerClient
import BrokerProtocol
import FoundationEssentials

/// `--best-effort` of `token` and `header`: a script that would rather have a short token than
/// none gets the freshest one the broker holds when it refuses one valid for `--min-ttl`, with
/// a warning on stderr saying how long it lasts, and brokerctl exits 0.
enum BestEffort {
    /// The refusals a token valid for less than asked may get past.
    static let refusals: [BrokerError.Code] = [.lifetimeTooShort, .unavailable, .busy, .needsLogin]

    /// What `ask` gives for `minTTL`; with `enabled`, after one of `refusals`, what it gives for
    /// no minimum, told on stderr (the refusal stands when that fails too).
    static func token(minTTL: Double?, enabled: Bool, _ ask: (Double?) throws -> TokenResult) throws -> TokenResult {
        do {
            return try ask(minTTL)
        } catch let refusal as BrokerError where enabled && refusals.contains(refusal.code) {
            guard let token = try? ask(0) else { throw refusal }
            let left = Bounds.wholeSeconds(max(0, token.expiresAt.timeIntervalSinceNow))
            StandardStream.error.write(
                "brokerctl: warning: this token is valid for \(left) s only: \(refusal.message)\n")
            return token
        }
    }
}
