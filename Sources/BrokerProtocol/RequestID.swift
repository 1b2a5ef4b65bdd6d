/// The `id` a client puts on a request; echoed verbatim on the response.
///
/// Any JSON string or number is accepted. `null` is used on responses to lines that
/// carried no usable id (not JSON, not an object).
public enum RequestID: Hashable, Sendable, Codable, CustomStringConvertible {
    case string(String)
    case integer(Int64)
    case number(Double)
    case null

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Int64.self) {
            self = .integer(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else {
            throw DecodingError.typeMismatch(
                RequestID.self,
                .init(codingPath: decoder.codingPath, debugDescription: "id must be a string or a number")
            )
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .string(let value): try container.encode(value)
        case .integer(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .null: try container.encodeNil()
        }
    }

    public var description: String {
        switch self {
        case .string(let value): return "\"\(value)\""
        case .integer(let value): return String(value)
        case .number(let value): return String(value)
        case .null: return "null"
        }
    }
}
