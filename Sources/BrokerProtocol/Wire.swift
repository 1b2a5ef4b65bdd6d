import FoundationEssentials

/// Encoding and decoding of protocol lines, shared by the broker and its clients so
/// both sides agree on dates (RFC 3339 UTC, whole seconds) and key names.
public enum Wire {
    /// A JSON encoder configured for the wire (RFC 3339 dates, compact output).
    public static func makeEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(rfc3339(date))
        }
        encoder.outputFormatting = [.withoutEscapingSlashes, .sortedKeys]
        return encoder
    }

    /// A JSON decoder configured for the wire (RFC 3339 dates with or without fractions).
    public static func makeDecoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let container = try decoder.singleValueContainer()
            let text = try container.decode(String.self)
            guard let date = parseRFC3339(text) else {
                throw DecodingError.dataCorruptedError(
                    in: container, debugDescription: "not an RFC 3339 timestamp: \(text)")
            }
            return date
        }
        return decoder
    }

    /// Formats a date as RFC 3339 in UTC with whole seconds, e.g. `2026-11-23T08:30:00Z`.
    /// Years 1600 to 9999 are written here, from the days since 1970 (`CivilDate`): the format
    /// style set up its calendar on every call, a tenth of brokerd's start with 1,000 accounts.
    /// Other dates go to the format style (whose calendar is Julian before 1582).
    public static func rfc3339(_ date: Date) -> String {
        // Whole seconds of the date as it is stored (since 2001), as the format style takes them:
        // adding the 1970 offset first could round a date just short of a second up to it.
        let sinceReference = date.timeIntervalSinceReferenceDate.rounded(.down)
        let referenceSince1970: Int64 = 978_307_200
        guard sinceReference >= -12_654_403_200, sinceReference < 252_423_993_600 else { return formattedRFC3339(date) }
        let seconds = Int64(sinceReference) + referenceSince1970
        let (days, secondOfDay) = seconds.quotientAndRemainder(dividingBy: 86_400)
        let (day, time) = secondOfDay < 0 ? (days - 1, secondOfDay + 86_400) : (days, secondOfDay)
        let civil = CivilDate.date(days: day)
        func digits(_ value: Int64, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return digits(civil.year, 4) + "-" + digits(civil.month, 2) + "-" + digits(civil.day, 2) + "T"
            + digits(time / 3600, 2)
            + ":" + digits(time / 60 % 60, 2) + ":" + digits(time % 60, 2) + "Z"
    }

    /// `rfc3339` by FoundationEssentials' ISO 8601 format style.
    static func formattedRFC3339(_ date: Date) -> String {
        date.formatted(
            .iso8601.year().month().day().dateSeparator(.dash).time(includingFractionalSeconds: false)
                .timeSeparator(.colon).timeZone(separator: .omitted))
    }

    /// Parses an RFC 3339 timestamp, with or without fractional seconds.
    public static func parseRFC3339(_ text: String) -> Date? {
        if let date = try? Date(text, strategy: .iso8601) { return date }
        return try? Date(text, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: true))
    }

    /// One success line: `{"id":…,"ok":true,"result":…}` plus the newline.
    public static func successLine<Result: Encodable>(
        id: RequestID?, result: Result, encoder: JSONEncoder
    ) throws -> Data {
        var data = try encoder.encode(Envelope(id: id ?? .null, ok: true, body: result))
        data.append(0x0A)
        return data
    }

    /// One failure line: `{"id":…,"ok":false,"error":{…}}` plus the newline.
    public static func errorLine(id: RequestID?, error: BrokerError, encoder: JSONEncoder) -> Data {
        let body = ErrorBody(code: error.code.rawValue, message: error.message, retryAfterMs: error.retryAfterMs)
        var data =
            (try? encoder.encode(Envelope(id: id ?? .null, ok: false, body: body)))
            ?? Data(#"{"id":null,"ok":false,"error":{"code":"internal","message":"encoding failed"}}"#.utf8)
        data.append(0x0A)
        return data
    }
}

/// The error object of a failure line.
public struct ErrorBody: Codable, Sendable, Equatable {
    public var code: String
    public var message: String
    public var retryAfterMs: Int?

    public init(code: String, message: String, retryAfterMs: Int? = nil) {
        self.code = code
        self.message = message
        self.retryAfterMs = retryAfterMs
    }

    /// The typed error this body describes.
    public var brokerError: BrokerError {
        BrokerError(.init(wire: code), message, retryAfterMs: retryAfterMs)
    }

    enum CodingKeys: String, CodingKey {
        case code, message
        case retryAfterMs = "retry_after_ms"
    }
}

/// A response line: `{"id", "ok", "result"}` on success, `{"id", "ok", "error"}` on failure.
struct Envelope<Body: Encodable>: Encodable {
    var id: RequestID
    var ok: Bool
    var body: Body

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(ok, forKey: .ok)
        try container.encode(body, forKey: ok ? .result : .error)
    }

    enum CodingKeys: String, CodingKey { case id, ok, result, error }
}

/// The parts of a response line every client reads first: its id and whether it succeeded.
public struct ResponseHead: Decodable, Sendable {
    public var id: RequestID?
    /// Absent on event lines, which carry `event` instead.
    public var ok: Bool?
    public var error: ErrorBody?
    /// Set on the event lines of a subscription.
    public var event: String?
}

/// Decodes the `result` of a success line into the type the caller expects.
public struct ResultBody<Result: Decodable>: Decodable {
    public var result: Result
}
