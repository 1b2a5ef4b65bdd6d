import FoundationEssentials

/// JSON of unknown shape (an IdP's answer, a helper's output) as `[String: Any]`, read with the
/// toolchain's strict `JSONDecoder`: strings are `String`, numbers `Double`, `true`/`false`
/// `Bool`, arrays `[Any]`, objects `[String: Any]` and `null` a `JSONNull`.
/// (`JSONSerialization`, which gave this shape before, needs the whole of Foundation.)
enum UntypedJSON {
    /// The object `data` holds; `nil` when it is not JSON or not an object.
    static func object(_ data: Data) -> [String: Any]? {
        (try? JSONDecoder().decode(Value.self, from: data))?.value as? [String: Any]
    }

    /// One value of any JSON type.
    private struct Value: Decodable {
        let value: Any

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if container.decodeNil() {
                value = JSONNull()
            } else if let bool = try? container.decode(Bool.self) {
                value = bool
            } else if let number = try? container.decode(Double.self) {
                value = number
            } else if let text = try? container.decode(String.self) {
                value = text
            } else if let array = try? container.decode([Value].self) {
                value = array.map(\.value)
            } else {
                value = try container.decode([String: Value].self).mapValues(\.value)
            }
        }
    }
}

/// JSON's `null` in what `UntypedJSON` reads.
struct JSONNull: Equatable {}
