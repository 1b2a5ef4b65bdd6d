import BrokerProtocol
import FoundationEssentials

/// The failure line of one error that many requests share (a refresh that failed for every
/// client waiting on it), encoded once: only the id differs between their lines, and it is
/// written by hand in front of the error object, as `PreparedToken` writes a token's line.
struct SharedErrorLine: Error, Sendable {
    /// `,"ok":false,"error":{…}}` and the newline.
    private let tail: [UInt8]

    init(_ error: BrokerError) {
        let body = ErrorBody(code: error.code.rawValue, message: error.message, retryAfterMs: error.retryAfterMs)
        let object =
            (try? Wire.makeEncoder().encode(body)).map { Array($0) }
            ?? Array(#"{"code":"internal","message":"encoding failed"}"#.utf8)
        tail = Array(#","ok":false,"error":"#.utf8) + object + Array("}\n".utf8)
    }

    /// The line for request `id`, newline included.
    func line(id: RequestID?) -> [UInt8] {
        Array(#"{"id":"#.utf8) + Array(JSONText.encode(id ?? .null).utf8) + tail
    }
}
