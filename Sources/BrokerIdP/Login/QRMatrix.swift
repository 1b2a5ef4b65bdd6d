import BrokerModel
import BrokerSecrets
import CQREncode

/// The QR code of a text (libqrencode, error correction level L: the smallest symbol, for a
/// screen that nothing smudges), as rows of `1` (dark module) and `0`, without the quiet zone.
package enum QRMatrix {
    /// The rows for `text`; `nil` when libqrencode cannot encode it (too long, out of memory).
    package static func rows(of text: String) -> [String]? {
        guard let code = QRcode_encodeString(text, 0, QR_ECLEVEL_L, QR_MODE_8, 1) else { return nil }
        defer { QRcode_free(code) }
        let width = Int(code.pointee.width)
        let modules = UnsafeBufferPointer(start: code.pointee.data, count: width * width)
        return (0..<width).map { row in
            String(modules[(row * width)..<((row + 1) * width)].map { $0 & 1 == 1 ? "1" : "0" })
        }
    }
}
