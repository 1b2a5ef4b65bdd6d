import BrokerModel
import BrokerSecrets

/// An http(s) URL without query and fragment in the normal form of RFC 3986 section 6.2.2
/// (docs/dpop.md, "Which URLs get a proof"): scheme and host lowercased, the scheme's default
/// port left out, escapes of unreserved characters decoded and the others in uppercase hex,
/// characters a path may not hold escaped, dot segments removed (section 5.2.4), an empty path
/// made `/`. A proof's `htu` is this form, so that one request has one spelling whatever the
/// program wrote, and the broker compares what it signs.
public struct NormalizedURL: Sendable, Hashable, CustomStringConvertible {
    /// `https` or `http`.
    public let scheme: String
    /// Lowercased, as written otherwise (`[::1]` with its brackets).
    public let host: String
    /// The port when it is not the scheme's default.
    public let port: Int?
    /// Starts with `/`.
    public let path: String

    /// `nil` when `text` is no absolute http(s) URL with a host (a port from 1 to 65535, no user
    /// information) or holds a `%` that starts no escape. A query or fragment is dropped.
    public init?(_ text: String) {
        let bytes = Array(text.utf8.prefix { $0 != UInt8(ascii: "?") && $0 != UInt8(ascii: "#") })
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")),
            bytes[colon...].starts(with: "://".utf8)
        else { return nil }
        let scheme = String(decoding: bytes[..<colon].map(Self.lowercased), as: UTF8.self)
        guard scheme == "https" || scheme == "http" else { return nil }
        let rest = bytes[(colon + 3)...]
        let slash = rest.firstIndex(of: UInt8(ascii: "/")) ?? rest.endIndex
        guard let authority = Self.hostAndPort(rest[..<slash]), let path = Self.path(rest[slash...]) else {
            return nil
        }
        self.scheme = scheme
        host = authority.host
        port = authority.port == (scheme == "https" ? 443 : 80) ? nil : authority.port
        self.path = path
    }

    /// The normal form.
    public var description: String { "\(scheme)://\(host)\(port.map { ":\($0)" } ?? "")\(path)" }

    /// The port, given or the scheme's.
    package var effectivePort: Int { port ?? (scheme == "https" ? 443 : 80) }

    /// The host (a bracketed IPv6 literal, or a reg-name without escapes) lowercased and the port
    /// given, if any; `nil` for user information, escapes or anything else.
    private static func hostAndPort(_ authority: ArraySlice<UInt8>) -> (host: String, port: Int?)? {
        let hostEnd: Int
        if authority.first == UInt8(ascii: "[") {
            guard let close = authority.firstIndex(of: UInt8(ascii: "]")) else { return nil }
            guard
                authority[authority.startIndex + 1..<close].allSatisfy({
                    isHex($0) || $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: ".")
                })
            else { return nil }
            hostEnd = close + 1
        } else {
            hostEnd = authority.firstIndex(of: UInt8(ascii: ":")) ?? authority.endIndex
            guard authority[..<hostEnd].allSatisfy({ isUnreserved($0) || subDelimiters.contains($0) }) else {
                return nil
            }
        }
        let host = authority[..<hostEnd]
        var port: Int? = nil
        if hostEnd < authority.endIndex {
            let digits = authority[(hostEnd + 1)...]
            guard authority[hostEnd] == UInt8(ascii: ":"), digits.count <= 5,
                digits.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
            else { return nil }
            if !digits.isEmpty {
                guard let value = Int(String(decoding: digits, as: UTF8.self)), (1...65535).contains(value) else {
                    return nil
                }
                port = value
            }
        }
        guard host.count > (host.first == UInt8(ascii: "[") ? 2 : 0) else { return nil }
        return (String(decoding: host.map(lowercased), as: UTF8.self), port)
    }

    /// The path in normal form; `nil` when a `%` starts no escape.
    private static func path(_ bytes: ArraySlice<UInt8>) -> String? {
        var escaped: [UInt8] = []
        escaped.reserveCapacity(bytes.count + 1)
        var index = bytes.startIndex
        while index < bytes.endIndex {
            let byte = bytes[index]
            if byte == UInt8(ascii: "%") {
                guard index + 2 < bytes.endIndex, let high = hexValue(bytes[index + 1]),
                    let low = hexValue(bytes[index + 2])
                else { return nil }
                append(high << 4 | low, to: &escaped)
                index += 3
            } else {
                if byte == UInt8(ascii: "/") || isPathCharacter(byte) {
                    escaped.append(byte)
                } else {
                    append(byte, to: &escaped)
                }
                index += 1
            }
        }
        return withoutDotSegments(String(decoding: escaped, as: UTF8.self))
    }

    /// Appends `byte` as itself when unreserved, else as an escape in uppercase hex.
    private static func append(_ byte: UInt8, to bytes: inout [UInt8]) {
        if isUnreserved(byte) {
            bytes.append(byte)
        } else {
            let digits = Array("0123456789ABCDEF".utf8)
            bytes += [UInt8(ascii: "%"), digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]]
        }
    }

    /// RFC 3986 section 5.2.4 for a path that is empty or starts with `/`; `/` for an empty one.
    package static func withoutDotSegments(_ path: String) -> String {
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        var kept: [Substring] = []
        for (index, segment) in zip(segments.indices, segments) {
            let isLast = index == segments.endIndex - 1
            switch segment {
            case ".":
                if isLast { kept.append("") }
            case "..":
                if !kept.isEmpty { kept.removeLast() }
                if isLast { kept.append("") }
            default:
                kept.append(segment)
            }
        }
        return "/" + kept.joined(separator: "/")
    }

    /// RFC 3986 `sub-delims`.
    private static let subDelimiters = Set("!$&'()*+,;=".utf8)

    /// RFC 3986 `pchar` but escapes: unreserved, sub-delims, `:` and `@`.
    private static func isPathCharacter(_ byte: UInt8) -> Bool {
        isUnreserved(byte) || subDelimiters.contains(byte) || byte == UInt8(ascii: ":") || byte == UInt8(ascii: "@")
    }

    /// RFC 3986 `unreserved`.
    package static func isUnreserved(_ byte: UInt8) -> Bool {
        isAlphanumeric(byte) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_")
            || byte == UInt8(ascii: "~")
    }

    private static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
            || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
    }

    private static func isHex(_ byte: UInt8) -> Bool { hexValue(byte) != nil }

    package static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    private static func lowercased(_ byte: UInt8) -> UInt8 {
        (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte + 0x20 : byte
    }
}
