import Crypto
import Foundation

/// Makes DPoP proofs (RFC 9449 section 4.2) with an ES256 key of its own, and bad ones on
/// purpose (`Flaws`): the tests' client when the broker is not the one signing, and the
/// attacker who holds a stolen token but not the broker's key.
public struct DPoPTestSigner: Sendable {
    /// What to get wrong in a proof; the defaults make a good one.
    public struct Flaws: Sendable {
        /// The `typ` header; `nil` leaves it out.
        public var typ: String? = "dpop+jwt"
        /// The `alg` header: `none` leaves the signature empty; anything else is written over an
        /// ES256 signature.
        public var alg = "ES256"
        /// Puts the private key (`d`) into the `jwk` header.
        public var privateKeyInJWK = false
        /// The `crv` of the `jwk` header.
        public var curve = "P-256"
        /// Signs with a fresh key instead of the one the `jwk` header shows.
        public var foreignSignature = false
        /// Raw JSON for `iat` in place of the integer, e.g. `1.5` or `"123"`.
        public var iat: String?

        public init() {}
    }

    private let key: P256.Signing.PrivateKey

    /// A signer with a new random key.
    public init() { key = P256.Signing.PrivateKey() }

    /// A signer with the P-256 private key `rawPrivateKey` (the 32-byte scalar).
    public init(rawPrivateKey: Data) throws {
        key = try P256.Signing.PrivateKey(rawRepresentation: rawPrivateKey)
    }

    /// The public key's `x` coordinate, base64url.
    public var x: String { DPoPVerifier.base64URL(key.publicKey.rawRepresentation.prefix(32)) }
    /// The public key's `y` coordinate, base64url.
    public var y: String { DPoPVerifier.base64URL(key.publicKey.rawRepresentation.suffix(32)) }
    /// The key's RFC 7638 thumbprint, as `dpop_jkt` and the verifier state it.
    public var thumbprint: String { DPoPVerifier.thumbprint(x: x, y: y) }

    /// A proof for `method` and `url` issued at `date`, with `ath` for `accessToken`, the
    /// server's `nonce` and the given `jti` (a fresh random one by default) when given.
    public func proof(
        method: String = "POST", url: String, at date: Date = Date(), accessToken: String? = nil,
        nonce: String? = nil, jti: String? = nil, flaws: Flaws = Flaws()
    ) -> String {
        var jwk = [("kty", Self.json("EC")), ("crv", Self.json(flaws.curve)), ("x", Self.json(x)), ("y", Self.json(y))]
        if flaws.privateKeyInJWK { jwk.append(("d", Self.json(DPoPVerifier.base64URL(key.rawRepresentation)))) }
        var header = [("alg", Self.json(flaws.alg)), ("jwk", Self.object(jwk))]
        if let typ = flaws.typ { header.insert(("typ", Self.json(typ)), at: 0) }
        var payload = [
            ("jti", Self.json(jti ?? UUID().uuidString)), ("htm", Self.json(method)), ("htu", Self.json(url)),
            ("iat", flaws.iat ?? String(Int64(date.timeIntervalSince1970))),
        ]
        if let accessToken { payload.append(("ath", Self.json(DPoPVerifier.hash(accessToken)))) }
        if let nonce { payload.append(("nonce", Self.json(nonce))) }
        let input =
            DPoPVerifier.base64URL(Data(Self.object(header).utf8)) + "."
            + DPoPVerifier.base64URL(Data(Self.object(payload).utf8))
        guard flaws.alg != "none" else { return input + "." }
        let signer = flaws.foreignSignature ? P256.Signing.PrivateKey() : key
        // Signing with a valid key fails only when the system's random source does.
        let signature = try! signer.signature(for: Data(input.utf8))
        return input + "." + DPoPVerifier.base64URL(signature.rawRepresentation)
    }

    /// `text` as a JSON string.
    private static func json(_ text: String) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .withoutEscapingSlashes
        // Encoding a string cannot fail.
        return String(decoding: try! encoder.encode(text), as: UTF8.self)
    }

    /// A JSON object of members whose values are already JSON.
    private static func object(_ members: [(String, String)]) -> String {
        "{" + members.map { "\(json($0.0)):\($0.1)" }.joined(separator: ",") + "}"
    }
}
