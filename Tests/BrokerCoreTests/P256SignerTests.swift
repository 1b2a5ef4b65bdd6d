import BrokerProtocol
import Crypto
import FoundationEssentials
import Testing

@testable import BrokerCore

/// The ES256 key DPoP proofs are signed with (docs/dpop.md, "Signing"), checked against
/// swift-crypto's P-256, another implementation: the public key it derives, the signatures it
/// verifies, and the nonces made ahead, each serving one signature.
@Suite struct P256SignerTests {
    /// The order of P-256's group (FIPS 186-4, D.1.2.3), big-endian.
    static let order: [UInt8] = hex("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551")

    static let refusedScalars: [[UInt8]] = [
        [UInt8](repeating: 0, count: 32), order,
        hex("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632552"),
        [UInt8](repeating: 0xff, count: 32), [UInt8](repeating: 1, count: 31), [UInt8](repeating: 1, count: 33),
    ]

    @Test(arguments: refusedScalars)
    func aScalarThatIsNoP256PrivateKeyIsRefused(_ scalar: [UInt8]) {
        #expect(throws: BrokerFailure.self) { try P256Signer(scalar: scalar) }
    }

    @Test func aKeyReadBackFromItsScalarHasThePublicKeySwiftCryptoDerives() throws {
        var scalar = [UInt8](repeating: 0, count: 32)
        let made = try P256Signer.generate(scalar: &scalar)
        let readBack = try P256Signer(scalar: scalar)
        let derived = Array(try P256.Signing.PrivateKey(rawRepresentation: scalar).publicKey.rawRepresentation)
        #expect(made.publicKey == derived && readBack.publicKey == derived)
        let (lastBelowOrder, one) = (
            Self.order.dropLast() + [Self.order.last! - 1], [UInt8](repeating: 0, count: 31) + [1]
        )
        for edge in [Array(lastBelowOrder), one] {
            #expect(
                try P256Signer(scalar: edge).publicKey
                    == Array(try P256.Signing.PrivateKey(rawRepresentation: edge).publicKey.rawRepresentation))
        }
    }

    @Test func noncesMadeAheadEachServeOneSignatureThatVerifies() throws {
        var scalar = [UInt8](repeating: 0, count: 32)
        let signer = try P256Signer.generate(scalar: &scalar)
        let publicKey = try P256.Signing.PublicKey(rawRepresentation: signer.publicKey)
        let message = Array("eyJ0eXAiOiJkcG9wK2p3dCJ9.e30".utf8)
        let capacity = P256Signer.presignatureCapacity
        #expect(signer.sign(message, nonce: .madeAhead) == nil, "no nonce is made ahead before a claim")
        #expect(signer.claimPresigning() == capacity)
        #expect(signer.claimPresigning() == 0, "one thread makes nonces at a time")
        signer.presign(capacity)
        #expect(signer.claimPresigning() == 0, "all the nonces kept are made")

        var rs: Set<[UInt8]> = []
        for round in 0..<capacity {
            if round == capacity / 2 - 1 { #expect(signer.claimPresigning() == 0, "more than half are ready") }
            if round == capacity / 2 { #expect(signer.claimPresigning() == capacity / 2, "half are used") }
            let signature = try #require(signer.sign(message, nonce: .madeAhead), "nonce \(round) is ready")
            try Self.expectVerified(signature, message, publicKey)
            rs.insert(Array(signature.prefix(32)))
        }
        #expect(signer.sign(message, nonce: .madeAhead) == nil, "every nonce made ahead is used")
        for nonce in [P256Signer.SignatureNonce.anyReady, .madeNow] {
            let signature = try #require(signer.sign(message, nonce: nonce))
            try Self.expectVerified(signature, message, publicKey)
            rs.insert(Array(signature.prefix(32)))
        }
        #expect(rs.count == capacity + 2, "every signature has a nonce of its own")
        signer.presign(capacity / 2)
        #expect(signer.sign(message, nonce: .madeAhead) != nil && signer.claimPresigning() == capacity / 2 + 1)
    }

    /// Checks `signature` of `message` with swift-crypto, and that it is no signature of another.
    private static func expectVerified(_ signature: [UInt8], _ message: [UInt8], _ key: P256.Signing.PublicKey) throws {
        let parsed = try P256.Signing.ECDSASignature(rawRepresentation: signature)
        #expect(key.isValidSignature(parsed, for: Data(message)))
        #expect(!key.isValidSignature(parsed, for: Data(message + [0x2e])), "a signature of another message")
    }

    private static func hex(_ text: String) -> [UInt8] {
        var bytes: [UInt8] = []
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(index, offsetBy: 2)
            bytes.append(UInt8(text[index..<next], radix: 16)!)
            index = next
        }
        return bytes
    }
}
