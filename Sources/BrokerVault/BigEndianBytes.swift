import BrokerIdP
import BrokerModel
import BrokerSecrets

/// Fixed-width unsigned integers in the vault's file headers, written and read big-endian.
extension Array where Element == UInt8 {
    /// Appends `value`'s bytes, most significant first.
    package mutating func append<Value: FixedWidthInteger & UnsignedInteger>(bigEndian value: Value) {
        for shift in stride(from: Value.bitWidth - 8, through: 0, by: -8) {
            append(UInt8(truncatingIfNeeded: value >> shift))
        }
    }
}

extension Collection where Element == UInt8, Index == Int {
    /// The `Value` whose bytes start at `offset`, most significant first; the caller checked
    /// that they are all there.
    package func bigEndian<Value: FixedWidthInteger & UnsignedInteger>(_: Value.Type, at offset: Int) -> Value {
        (offset..<offset + Value.bitWidth / 8).reduce(0) { $0 << 8 | Value(self[$1]) }
    }
}
