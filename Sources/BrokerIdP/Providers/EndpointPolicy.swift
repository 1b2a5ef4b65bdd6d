import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// Which IdP URLs the broker will call: https everywhere, plain http only for canonical
/// loopback literals, and a port (when given) from 1 to 65535.
public enum EndpointPolicy {
    public static func isAllowed(_ url: URL) -> Bool {
        guard let origin = Origin(url) else { return false }
        return origin.scheme == "https" || LoopbackHost.contains(origin.host)
    }

    /// The URL a `provider` object gives in `field`, or a `bad_request` naming the field when
    /// it is not one the broker will call.
    package static func checkedURL(_ text: String, field: String) throws(BrokerFailure) -> URL {
        guard let url = URL(string: text), isAllowed(url) else {
            throw .invalid("\"\(field)\" must be an https URL (http only for loopback)")
        }
        return url
    }

    /// Whether `url`, handed over by an IdP (a discovery document, a rotated refresh URL), may
    /// replace a URL of `base`: allowed, and never from https down to http.
    public static func isAllowed(_ url: URL, handedOverBy base: URL) -> Bool {
        guard isAllowed(url) else { return false }
        return url.scheme?.lowercased() == "https" || base.scheme?.lowercased() != "https"
    }
}

/// Scheme, host and port of a URL (RFC 6454): a credential stays with the origin it was stored for.
public struct Origin: Hashable, Sendable, CustomStringConvertible {
    public var scheme: String
    public var host: String
    public var port: Int

    /// `nil` unless `url` is http or https with an ASCII host (IDNs in their punycode form) and a
    /// port (given or default) from 1 to 65535. Only ASCII is lowercased, as resolvers do.
    public init?(_ url: URL) {
        guard let scheme = url.scheme?.lowercased(), scheme == "https" || scheme == "http",
            let host = url.host, !host.isEmpty, host.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F })
        else { return nil }
        let port = url.port ?? (scheme == "https" ? 443 : 80)
        guard (1...65535).contains(port) else { return nil }
        self.scheme = scheme
        self.host = String(decoding: host.utf8.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }, as: UTF8.self)
        self.port = port
    }

    public var description: String {
        "\(scheme)://\(host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host):\(port)"
    }
}
