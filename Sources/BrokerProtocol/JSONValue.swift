import FoundationEssentials

/// Any JSON value, kept as it was sent: the settings of a `provider` object, which each
/// provider kind reads and checks for itself (the protocol module does not know the kinds), and
/// answers of unknown shape (an IdP's, a helper's output), read with `object(decoding:)`.
public enum JSONValue: Codable, Sendable, Equatable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// The object `data` holds, read with the toolchain's strict `JSONDecoder`; `nil` when it is
    /// not JSON or not an object.
    public static func object(decoding data: Data) -> [String: JSONValue]? {
        (try? JSONDecoder().decode(JSONValue.self, from: data))?.object
    }

    /// The members of an object value; `nil` for any other value.
    public var object: [String: JSONValue]? {
        if case .object(let members) = self { return members }
        return nil
    }

    /// A number value; `nil` for any other value (`true` is not 1).
    public var number: Double? {
        if case .number(let number) = self { return number }
        return nil
    }

    /// A `true` or `false` value; `nil` for any other value.
    public var bool: Bool? {
        if case .bool(let value) = self { return value }
        return nil
    }

    /// The text of a string value; `nil` for any other value.
    public var text: String? {
        if case .string(let text) = self { return text }
        return nil
    }

    /// The texts of an array that holds only strings; `nil` for any other value.
    public var texts: [String]? {
        guard case .array(let elements) = self else { return nil }
        let texts = elements.compactMap(\.text)
        return texts.count == elements.count ? texts : nil
    }
}

extension JSONValue: ExpressibleByStringLiteral {
    public init(stringLiteral value: String) { self = .string(value) }
}

extension JSONValue: ExpressibleByArrayLiteral {
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
}
