import Crypto
import Foundation
import Synchronization

/// Why a DPoP proof was refused: one stable reason per check of RFC 9449 section 4.3, so that a
/// test can tell which check fired rather than only that one did.
public struct DPoPRefusal: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String

    public init(_ reason: String) { self.reason = reason }

    public var description: String { "DPoP proof refused: \(reason)" }

    /// No `DPoP` header, or an empty one.
    public static let missing = DPoPRefusal("missing")
    /// More than one proof (several headers, or values joined by a comma).
    public static let multiple = DPoPRefusal("multiple")
    /// Over `DPoPVerifier.maximumSize` bytes.
    public static let tooLarge = DPoPRefusal("too_large")
    /// Not three base64url parts, or a header or payload that is not a JSON object.
    public static let malformed = DPoPRefusal("malformed")
    public static let typ = DPoPRefusal("typ")
    /// Not ES256: `none`, symmetric and every other algorithm are refused.
    public static let alg = DPoPRefusal("alg")
    /// Not an EC P-256 public key with 32-byte `x` and `y` on the curve.
    public static let jwk = DPoPRefusal("jwk")
    /// The `jwk` carries a private key (`d`).
    public static let jwkPrivate = DPoPRefusal("jwk_private")
    public static let signature = DPoPRefusal("signature")
    /// No `jti`, or one shorter than 16 characters.
    public static let jti = DPoPRefusal("jti")
    public static let htm = DPoPRefusal("htm")
    public static let htu = DPoPRefusal("htu")
    /// No integer `iat`, or one outside the window.
    public static let iat = DPoPRefusal("iat")
    public static let ath = DPoPRefusal("ath")
    public static let nonce = DPoPRefusal("nonce")
    /// Signed by another key than the one the token or code is bound to.
    public static let jkt = DPoPRefusal("jkt")
    /// A `jti` this verifier has accepted before.
    public static let replayed = DPoPRefusal("replayed")
}

/// Checks DPoP proofs (RFC 9449) as an authorization or resource server must (section 4.3),
/// for ES256 keys only, with its own memory of the `jti`s it accepted (section 11.1): the other
/// side of the broker's proofs, strict enough that a test passing against it means something.
public final class DPoPVerifier: Sendable {
    /// The refusal's name as callers inside the verifier's namespace spell it.
    public typealias DPoPRefusal = TestSupport.DPoPRefusal

    /// The largest proof looked at: a real one is well under 1 KiB.
    public static let maximumSize = 8192

    private let window: TimeInterval
    private let seen = Mutex(Set<String>())

    /// `window`: how far `iat` may be from the verifier's clock, either way, in seconds.
    public init(window: TimeInterval = 60) {
        precondition(window.isFinite && window > 0 && window <= 86_400, "a DPoP window of \(window) s")
        self.window = window
    }

    /// Verifies the values of a request's `DPoP` headers: exactly one proof is allowed.
    public func verify(
        proofs: [String], method: String, url: String, now: Date, accessToken: String? = nil, nonce: String? = nil,
        boundTo jkt: String? = nil
    ) throws(DPoPRefusal) -> String {
        guard let proof = proofs.first else { throw .missing }
        guard proofs.count == 1 else { throw .multiple }
        return try verify(
            proof, method: method, url: url, now: now, accessToken: accessToken, nonce: nonce, boundTo: jkt)
    }

    /// Verifies `proof` for a request of `method` to `url` at `now`; returns the proof key's
    /// RFC 7638 JWK SHA-256 thumbprint (base64url, no padding). `accessToken` demands a matching
    /// `ath`, `nonce` a matching `nonce`, `jkt` that the key has that thumbprint. The `jti` is
    /// remembered only once every check passed, so a refused proof changes nothing.
    public func verify(
        _ proof: String, method: String, url: String, now: Date, accessToken: String? = nil, nonce: String? = nil,
        boundTo jkt: String? = nil
    ) throws(DPoPRefusal) -> String {
        guard proof.utf8.count <= Self.maximumSize else { throw .tooLarge }
        guard !proof.isEmpty else { throw .missing }
        guard !proof.contains(",") else { throw .multiple }
        let parts = proof.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let header = Self.object(parts[0]) else { throw .malformed }

        guard header["typ"] as? String == "dpop+jwt" else { throw .typ }
        guard header["alg"] as? String == "ES256" else { throw .alg }
        guard let jwk = header["jwk"] as? [String: Any] else { throw .jwk }
        guard jwk["d"] == nil else { throw .jwkPrivate }
        guard jwk["kty"] as? String == "EC", jwk["crv"] as? String == "P-256", let x = jwk["x"] as? String,
            let y = jwk["y"] as? String, let xBytes = Self.base64URLDecoded(x), let yBytes = Self.base64URLDecoded(y),
            xBytes.count == 32, yBytes.count == 32,
            let key = try? P256.Signing.PublicKey(rawRepresentation: xBytes + yBytes)
        else { throw .jwk }
        guard let signatureBytes = Self.base64URLDecoded(parts[2]), signatureBytes.count == 64,
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureBytes),
            key.isValidSignature(signature, for: Data("\(parts[0]).\(parts[1])".utf8))
        else { throw .signature }

        guard let payload = Self.object(parts[1]) else { throw .malformed }
        guard let jti = payload["jti"] as? String, jti.count >= 16 else { throw .jti }
        guard payload["htm"] as? String == method else { throw .htm }
        guard let htu = payload["htu"] as? String, let claimed = Self.normalised(htu), !claimed.hasQueryOrFragment,
            let requested = Self.normalised(url), claimed.base == requested.base
        else { throw .htu }
        guard let issued = Self.integer(payload["iat"]), now.timeIntervalSince1970.isFinite,
            abs(Double(issued) - now.timeIntervalSince1970) <= window
        else { throw .iat }
        if let accessToken {
            guard payload["ath"] as? String == Self.hash(accessToken) else { throw .ath }
        }
        if let nonce {
            guard payload["nonce"] as? String == nonce else { throw .nonce }
        }
        // Of the key's bytes, not of the text sent: base64url spelled with other trailing bits
        // is the same key.
        let thumbprint = Self.thumbprint(x: Self.base64URL(xBytes), y: Self.base64URL(yBytes))
        if let jkt, jkt != thumbprint { throw .jkt }
        guard seen.withLock({ $0.insert(jti).inserted }) else { throw .replayed }
        return thumbprint
    }

    /// The RFC 7638 thumbprint of the P-256 key (`x`, `y` base64url): SHA-256 of its required
    /// members in lexical order with no whitespace, base64url without padding.
    public static func thumbprint(x: String, y: String) -> String {
        hash(#"{"crv":"P-256","kty":"EC","x":"\#(x)","y":"\#(y)"}"#)
    }

    /// base64url(SHA-256(`text`)): an `ath` for an access token, or a thumbprint.
    public static func hash(_ text: String) -> String { base64URL(Data(SHA256.hash(data: Data(text.utf8)))) }

    /// base64url without padding (RFC 7515 section 2).
    public static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// Decodes base64url without padding; `nil` for any other character, padding included.
    public static func base64URLDecoded(_ text: some StringProtocol) -> Data? {
        let allowed = CharacterSet(charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        guard !text.isEmpty, text.unicodeScalars.allSatisfy(allowed.contains), text.count % 4 != 1 else { return nil }
        let standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        return Data(base64Encoded: standard + String(repeating: "=", count: (4 - standard.count % 4) % 4))
    }

    /// A JOSE header or payload: a JSON object in base64url. Duplicate member names keep the
    /// last, as RFC 7515 section 5.2 allows.
    private static func object(_ part: Substring) -> [String: Any]? {
        guard let data = base64URLDecoded(part) else { return nil }
        return (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
    }

    /// A JSON integer (not a fraction, exponent form or boolean) that fits in 64 bits.
    private static func integer(_ value: Any?) -> Int64? {
        guard let number = value as? NSNumber, ["i", "l", "q", "s"].contains(String(cString: number.objCType)) else {
            return nil
        }
        return number.int64Value
    }

    /// `url` after RFC 3986 syntax- and scheme-based normalisation (sections 6.2.2 and 6.2.3):
    /// scheme and host lowercase, percent-encodings uppercase and unreserved ones decoded, dot
    /// segments removed, the default port dropped, an empty path `/`; without its query and
    /// fragment, and whether it had either. `nil` for anything but an absolute http(s) URL
    /// without user information.
    static func normalised(_ url: String) -> (base: String, hasQueryOrFragment: Bool)? {
        guard url.utf8.count <= maximumSize, let components = URLComponents(string: url),
            let scheme = components.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = components.percentEncodedHost, !host.isEmpty, components.percentEncodedUser == nil,
            components.percentEncodedPassword == nil
        else { return nil }
        let defaultPort = scheme == "http" ? 80 : 443
        let port = components.port.flatMap { $0 == defaultPort ? nil : ":\($0)" } ?? ""
        let path = removingDotSegments(normalisedPercentEncoding(components.percentEncodedPath))
        let base = "\(scheme)://\(normalisedPercentEncoding(host.lowercased()))\(port)\(path.isEmpty ? "/" : path)"
        return (base, components.percentEncodedQuery != nil || components.percentEncodedFragment != nil)
    }

    /// Uppercase hex digits in percent-encodings, and unreserved characters decoded.
    private static func normalisedPercentEncoding(_ text: String) -> String {
        let bytes = Array(text.utf8)
        var result: [UInt8] = []
        var index = 0
        while index < bytes.count {
            if bytes[index] == UInt8(ascii: "%"), index + 2 < bytes.count,
                let high = hexValue(bytes[index + 1]), let low = hexValue(bytes[index + 2])
            {
                let byte = high << 4 | low
                if CharacterSet.urlUnreserved.contains(Unicode.Scalar(byte)) {
                    result.append(byte)
                } else {
                    result += Array(("%" + (byte < 16 ? "0" : "") + String(byte, radix: 16, uppercase: true)).utf8)
                }
                index += 3
            } else {
                result.append(bytes[index])
                index += 1
            }
        }
        return String(decoding: result, as: UTF8.self)
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        default: nil
        }
    }

    /// RFC 3986 section 5.2.4.
    private static func removingDotSegments(_ path: String) -> String {
        var input = Substring(path)
        var output = ""
        func dropLastSegment() {
            output = output.lastIndex(of: "/").map { String(output[..<$0]) } ?? ""
        }
        while !input.isEmpty {
            if input.hasPrefix("../") {
                input = input.dropFirst(3)
            } else if input.hasPrefix("./") {
                input = input.dropFirst(2)
            } else if input.hasPrefix("/./") {
                input = "/" + input.dropFirst(3)
            } else if input == "/." {
                input = "/"
            } else if input.hasPrefix("/../") {
                input = "/" + input.dropFirst(4)
                dropLastSegment()
            } else if input == "/.." {
                input = "/"
                dropLastSegment()
            } else if input == "." || input == ".." {
                input = ""
            } else {
                let start = input.hasPrefix("/") ? input.index(after: input.startIndex) : input.startIndex
                let end = input[start...].firstIndex(of: "/") ?? input.endIndex
                output += input[..<end]
                input = input[end...]
            }
        }
        return output
    }
}

extension CharacterSet {
    /// RFC 3986 section 2.3.
    fileprivate static let urlUnreserved = CharacterSet(
        charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
}
