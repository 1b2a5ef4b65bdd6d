/// A protocol error: one of the closed set of codes plus a message meant for people.
///
/// Equal by code, like `HTTPClientError`, so callers branch on `code` and show `message`.
public struct BrokerError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The closed set of error codes of protocol v1 (protocol/PROTOCOL.md section 10).
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String

        private init(_ rawValue: String) { self.rawValue = rawValue }

        /// Maps a wire string to a code; unknown strings (from a newer broker) become `internal`.
        public init(wire: String) {
            self = Code.all.first { $0.rawValue == wire } ?? .internal
        }

        public static let badRequest = Code("bad_request")
        public static let lineTooLong = Code("line_too_long")
        public static let unknownOp = Code("unknown_op")
        public static let unsupportedVersion = Code("unsupported_version")
        public static let notFound = Code("not_found")
        public static let forbidden = Code("forbidden")
        public static let needsLogin = Code("needs_login")
        public static let unavailable = Code("unavailable")
        public static let locked = Code("locked")
        public static let busy = Code("busy")
        /// The IdP grants tokens shorter than the `min_ttl` asked: no later try can meet it.
        public static let lifetimeTooShort = Code("lifetime_too_short")
        /// The account's record in the vault cannot be read by this broker's release.
        public static let damaged = Code("damaged")
        public static let `internal` = Code("internal")

        /// Every code, in the order the contract lists them.
        public static let all: [Code] = [
            .badRequest, .lineTooLong, .unknownOp, .unsupportedVersion, .notFound, .forbidden,
            .needsLogin, .unavailable, .locked, .busy, .internal, .lifetimeTooShort, .damaged,
        ]

        public var description: String { rawValue }
    }

    public let code: Code
    public let message: String
    /// Milliseconds after which retrying may help (`unavailable`, `busy`).
    public let retryAfterMs: Int?

    public init(_ code: Code, _ message: String, retryAfterMs: Int? = nil) {
        self.code = code
        self.message = message
        self.retryAfterMs = retryAfterMs
    }

    public static func == (lhs: BrokerError, rhs: BrokerError) -> Bool { lhs.code == rhs.code }

    public var description: String { "\(code): \(message)" }
}
