import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import Glibc

/// A URL as the refusal of proofs for an IdP's endpoints compares it (docs/dpop.md, "No proof
/// for the IdP's doors"): more loosely than its normal form, so that spellings a server may
/// read as the same request fall together. The origin is the host and port, whatever the
/// scheme (an IdP behind a proxy may not tell them apart); every loopback spelling is one host
/// (`localhost`, `127.0.0.1`, `127.1`, `[::1]`), an IPv4 or IPv6 literal is compared in its
/// canonical form, a trailing dot of a host is dropped; the path is decoded whole, repeated
/// slashes count as one and a trailing slash as none.
package struct DPoPDoor: Sendable, Hashable {
    /// The host as compared and the port, given or the scheme's.
    package let origin: String
    /// The decoded path without repeated or trailing slashes (`/` for the root).
    package let path: String

    package init(_ url: NormalizedURL) {
        origin = "\(Self.comparedHost(url.host)):\(url.effectivePort)"
        path = Self.comparedPath(url.path)
    }

    /// The door of an endpoint the broker calls, when it is an http(s) URL.
    package init?(_ url: URL) {
        guard let normalized = NormalizedURL(url.absoluteString) else { return nil }
        self.init(normalized)
    }

    /// `loopback` for a loopback host; an IP literal in its canonical form; a name without a
    /// trailing dot.
    package static func comparedHost(_ host: String) -> String {
        var name = host
        while name.hasSuffix(".") { name.removeLast() }
        if name == "localhost" || name.hasSuffix(".localhost") { return "loopback" }
        let canonical = canonicalIPv6(name) ?? canonicalIPv4(name) ?? name
        return LoopbackHost.contains(canonical) || canonical.hasPrefix("[::ffff:127.") ? "loopback" : canonical
    }

    /// A bracketed IPv6 literal as `inet_ntop` writes it, bracketed.
    private static func canonicalIPv6(_ host: String) -> String? {
        guard host.hasPrefix("["), host.hasSuffix("]") else { return nil }
        var address = in6_addr()
        guard inet_pton(AF_INET6, String(host.dropFirst().dropLast()), &address) == 1 else { return nil }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        guard inet_ntop(AF_INET6, &address, &text, socklen_t(text.count)) != nil else { return nil }
        return "[\(String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))]"
    }

    /// A host that `inet_aton` reads as IPv4 (`127.1`, `0x7f.0.0.1`, `2130706433`, which many
    /// HTTP clients resolve so), as a dotted quad.
    private static func canonicalIPv4(_ host: String) -> String? {
        guard let first = host.utf8.first, first >= UInt8(ascii: "0"), first <= UInt8(ascii: "9") else { return nil }
        var address = in_addr()
        guard inet_aton(host, &address) != 0 else { return nil }
        let value = UInt32(bigEndian: address.s_addr)
        return [24, 16, 8, 0].map { String((value >> $0) & 0xFF) }.joined(separator: ".")
    }

    /// `path` decoded, repeated slashes made one and a trailing one dropped.
    package static func comparedPath(_ path: String) -> String {
        var decoded: [UInt8] = []
        let bytes = Array(path.utf8)
        var index = 0
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: "%"), index + 2 < bytes.count,
                let high = NormalizedURL.hexValue(bytes[index + 1]), let low = NormalizedURL.hexValue(bytes[index + 2])
            {
                decoded.append(high << 4 | low)
                index += 3
            } else {
                decoded.append(bytes[index])
                index += 1
            }
        }
        let segments = decoded.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true)
        return "/" + segments.map { String(decoding: $0, as: UTF8.self) }.joined(separator: "/")
    }
}
