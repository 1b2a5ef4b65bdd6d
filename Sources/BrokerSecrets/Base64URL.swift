import BrokerModel
import FoundationEssentials

/// base64url without padding (RFC 4648 section 5), as PKCE, JWTs and DPoP proofs write it.
/// Written over bytes rather than through Foundation's base64 and string replacing: a DPoP
/// proof encodes three parts per request, and the string route cost a third of each proof.
package enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    /// Each byte's 6-bit value in `alphabet`, 0xFF for bytes outside it.
    private static let values: [UInt8] = {
        var values = [UInt8](repeating: 0xFF, count: 256)
        for (index, byte) in alphabet.enumerated() { values[Int(byte)] = UInt8(index) }
        return values
    }()

    package static func encode(_ bytes: [UInt8]) -> String {
        var text: [UInt8] = []
        encode(bytes, into: &text)
        return String(decoding: text, as: UTF8.self)
    }

    /// Appends the encoding of `bytes` to `text`.
    package static func encode(_ bytes: [UInt8], into text: inout [UInt8]) {
        text.reserveCapacity(text.count + (bytes.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= bytes.count {
            let group = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            for shift in [18, 12, 6, 0] as [UInt32] { text.append(alphabet[Int(group >> shift & 63)]) }
            index += 3
        }
        let left = bytes.count - index
        if left > 0 {
            let group = UInt32(bytes[index]) << 16 | (left == 2 ? UInt32(bytes[index + 1]) << 8 : 0)
            for shift in [18, 12, 6].prefix(left + 1) as ArraySlice<UInt32> {
                text.append(alphabet[Int(group >> shift & 63)])
            }
        }
    }

    /// The bytes of `text` (padding optional); `nil` when it is not base64url.
    package static func decode(_ text: some StringProtocol) -> Data? { decode(utf8: Array(text.utf8)) }

    /// The bytes that the UTF-8 `text` encodes (padding optional); `nil` when it is not base64url.
    package static func decode(utf8 text: some BidirectionalCollection<UInt8>) -> Data? {
        var characters = text[...]
        if characters.count % 4 == 0 {
            for _ in 0..<2 where characters.last == UInt8(ascii: "=") { characters = characters.dropLast() }
        }
        guard characters.count % 4 != 1 else { return nil }
        var bytes = Data(capacity: characters.count * 3 / 4)
        var group: UInt32 = 0
        var filled = 0
        for character in characters {
            let value = values[Int(character)]
            guard value != 0xFF else { return nil }
            group = group << 6 | UInt32(value)
            filled += 1
            if filled == 4 {
                bytes.append(UInt8(group >> 16 & 0xFF))
                bytes.append(UInt8(group >> 8 & 0xFF))
                bytes.append(UInt8(group & 0xFF))
                (group, filled) = (0, 0)
            }
        }
        // The bits left after the last whole byte must be zero (RFC 4648 section 3.5): one
        // spelling per byte string.
        if filled == 3 {
            guard group & 0x3 == 0 else { return nil }
            bytes.append(UInt8(group >> 10 & 0xFF))
            bytes.append(UInt8(group >> 2 & 0xFF))
        } else if filled == 2 {
            guard group & 0xF == 0 else { return nil }
            bytes.append(UInt8(group >> 4 & 0xFF))
        }
        return bytes
    }
}
