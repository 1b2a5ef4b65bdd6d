/// Reads a fuzz input from the front: small choices first, the rest as a body.
public struct FuzzInput {
    private var bytes: ArraySlice<UInt8>

    public init(_ start: UnsafePointer<UInt8>?, _ count: Int) {
        bytes = ArraySlice(UnsafeBufferPointer(start: start, count: count))
    }

    /// The next byte, 0 once the input is used up.
    public mutating func byte() -> UInt8 {
        bytes.popFirst() ?? 0
    }

    /// One of `choices`, picked by the next byte.
    public mutating func pick<Element>(_ choices: [Element]) -> Element {
        choices[Int(byte()) % choices.count]
    }

    /// The next eight bytes as a `Double` bit pattern (so infinities, NaNs and huge values too).
    public mutating func double() -> Double {
        Double(bitPattern: (0..<8).reduce(0) { value, _ in value << 8 | UInt64(byte()) })
    }

    /// Whatever is left.
    public mutating func rest() -> [UInt8] {
        defer { bytes = [] }
        return Array(bytes)
    }
}
