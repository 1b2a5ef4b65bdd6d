import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// An account's DPoP key (RFC 9449): a P-256 key pair made inside brokerd, whose private half
/// lives only in guarded memory (the vault's text in the broker's guarded pages, the signing
/// key in OpenSSL's secure heap, `P256Signer`) and the vault, and never leaves the process. It
/// signs the proofs of the account's requests at its IdP, and the proofs programs ask for
/// beside a token (`protocol/PROTOCOL.md`, `token`).
public final class DPoPKey: Sendable {
    /// The one algorithm keys are made for: ES256, which every DPoP IdP accepts.
    public static let algorithm = "ES256"

    /// The private scalar, 32 bytes as base64url text (the vault keeps it so).
    package let scalar: SecretBytes
    /// The public key's RFC 7638 thumbprint, base64url (the `cnf.jkt` of tokens bound to it).
    public let thumbprint: String
    /// The proof's JOSE header, base64url: the same for every proof of this key.
    private let header: [UInt8]
    private let signer: P256Signer

    /// The key whose private scalar `scalar` holds; fails when it is not a P-256 scalar, or
    /// when OpenSSL's secure heap has no room for it.
    package convenience init(scalar: SecretBytes) throws(BrokerFailure) {
        let signer = try scalar.withUnsafeBytes { text throws(BrokerFailure) in
            guard var raw = Base64URL.decode(utf8: text) else {
                throw .invalid("the vault holds a DPoP key that is not base64url")
            }
            defer { Sodium.wipe(&raw) }
            return try P256Signer(scalar: raw)
        }
        self.init(scalar: scalar, signer: signer)
    }

    private init(scalar: SecretBytes, signer: P256Signer) {
        let point = signer.publicKey
        let x = Base64URL.encode(Array(point[0..<32]))
        let y = Base64URL.encode(Array(point[32..<64]))
        // RFC 7638 section 3.2: the required members only, in lexicographic order, no spaces.
        let members = #"{"crv":"P-256","kty":"EC","x":""# + x + #"","y":""# + y + #""}"#
        thumbprint = Base64URL.encode(Sodium.sha256(Array(members.utf8)))
        let jwk = #"{"kty":"EC","crv":"P-256","x":""# + x + #"","y":""# + y + #""}"#
        header = Array(Base64URL.encode(Array((#"{"typ":"dpop+jwt","alg":"ES256","jwk":"# + jwk + "}").utf8)).utf8)
        self.scalar = scalar
        self.signer = signer
    }

    /// A new key from OpenSSL's random source.
    public static func generate() throws(BrokerFailure) -> DPoPKey {
        var raw = [UInt8](repeating: 0, count: 32)
        var text: [UInt8] = []
        defer {
            Sodium.wipe(&raw)
            Sodium.wipe(&text)
        }
        let signer = try P256Signer.generate(scalar: &raw)
        Base64URL.encode(raw, into: &text)
        let stored = text.withUnsafeBytes { bytes in
            Result { () throws(BrokerFailure) in try SecretBytes(bytes: bytes) }
        }
        return try DPoPKey(scalar: stored.get(), signer: signer)
    }

    /// A proof (RFC 9449 section 4.2) for a request of `method` to `url` (given without query
    /// or fragment) at `now`: a fresh 128-bit `jti`, `iat` in whole seconds, `ath` when the
    /// request carries an access token (`accessTokenHash`), `nonce` when the server gave one.
    /// `nil` when libcrypto fails to sign. A whole signature, tens of microseconds: not on an
    /// event loop.
    package func proof(
        method: String, url: String, now: Date, nonce: String? = nil, accessTokenHash: String? = nil
    ) -> String? {
        var claims: [UInt8] = []
        claims.reserveCapacity(
            Self.claimsOverhead + method.utf8.count + url.utf8.count + (nonce?.utf8.count ?? 0)
                + (accessTokenHash?.utf8.count ?? 0))
        claims += #"{"jti":""#.utf8
        Base64URL.encode(Sodium.randomBytes(16), into: &claims)
        claims += #"","htm":"#.utf8
        JSONText.appendQuoted(method.utf8, to: &claims)
        claims += #","htu":"#.utf8
        JSONText.appendQuoted(url.utf8, to: &claims)
        claims += #","iat":"#.utf8
        claims += String(Int64(now.timeIntervalSince1970.rounded(.down))).utf8
        if let accessTokenHash {
            claims += #","ath":""#.utf8
            claims += accessTokenHash.utf8
            claims += #"""#.utf8
        }
        if let nonce {
            claims += #","nonce":"#.utf8
            JSONText.appendQuoted(nonce.utf8, to: &claims)
        }
        claims.append(UInt8(ascii: "}"))
        // The whole proof in one buffer, grown once: header, claims and signature in base64url.
        var proof: [UInt8] = []
        proof.reserveCapacity(header.count + 1 + (claims.count * 4 + 2) / 3 + 1 + Self.signatureLength)
        proof += header
        proof.append(UInt8(ascii: "."))
        Base64URL.encode(claims, into: &proof)
        guard let signature = signer.sign(proof) else { return nil }
        proof.append(UInt8(ascii: "."))
        Base64URL.encode(signature, into: &proof)
        return String(decoding: proof, as: UTF8.self)
    }

    /// Bytes of the claims besides the method, URL, nonce and `ath`: names, quotes, a `jti`,
    /// an `iat`, and room for escapes.
    private static let claimsOverhead = 128

    /// An ES256 signature's length in base64url without padding (64 bytes).
    private static let signatureLength = 86

    /// The `ath` of `accessToken` (RFC 9449 section 4.2): base64url of its SHA-256.
    package static func accessTokenHash(_ accessToken: SecretBytes) -> String {
        accessToken.withUnsafeBytes { Base64URL.encode(Sodium.sha256($0)) }
    }

    /// Whether the memory signing keys live in is locked in RAM (`false` when the locked-memory
    /// limit refused it), as `SecretBytes.allLocked` tells of the other secrets.
    public static var signingMemoryLocked: Bool { P256Signer.secureHeapLocked }
}

extension DPoPKey: Equatable {
    public static func == (lhs: DPoPKey, rhs: DPoPKey) -> Bool { lhs.scalar == rhs.scalar }
}

extension DPoPKey: Codable {
    /// The vault's form: the private scalar as base64url text.
    public convenience init(from decoder: any Decoder) throws {
        try self.init(scalar: SecretBytes(from: decoder))
    }

    public func encode(to encoder: any Encoder) throws { try scalar.encode(to: encoder) }
}
