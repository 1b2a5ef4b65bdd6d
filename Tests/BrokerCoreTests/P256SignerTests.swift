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
        #expect(scalar.withUnsafeBytes { P256Signer(scalar: $0) } == nil)
    }

    @Test func aKeyReadBackFromItsScalarHasThePublicKeySwiftCryptoDerives() throws {
        var scalar = [UInt8](repeating: 0, count: 32)
        let made = try #require(scalar.withUnsafeMutableBytes { P256Signer.generate(scalar: $0) })
        let readBack = try #require(scalar.withUnsafeBytes { P256Signer(scalar: $0) })
        let derived = Array(try P256.Signing.PrivateKey(rawRepresentation: scalar).publicKey.rawRepresentation)
        #expect(made.publicKey == derived && readBack.publicKey == derived)
        let (lastBelowOrder, one) = (
            Self.order.dropLast() + [Self.order.last! - 1], [UInt8](repeating: 0, count: 31) + [1]
        )
        for edge in [Array(lastBelowOrder), one] {
            let signer = try #require(edge.withUnsafeBytes { P256Signer(scalar: $0) })
            #expect(
                signer.publicKey
                    == Array(try P256.Signing.PrivateKey(rawRepresentation: edge).publicKey.rawRepresentation))
        }
    }

    @Test func noncesMadeAheadEachServeOneSignatureThatVerifies() throws {
        var scalar = [UInt8](repeating: 0, count: 32)
        let signer = try #require(scalar.withUnsafeMutableBytes { P256Signer.generate(scalar: $0) })
        let publicKey = try P256.Signing.PublicKey(rawRepresentation: signer.publicKey)
        #expect(!signer.hasPresignature)
        #expect(signer.claimPresigning())
        #expect(!signer.claimPresigning(), "one thread makes nonces at a time")
        signer.presign()
        #expect(signer.hasPresignature)
        #expect(!signer.claimPresigning(), "all the nonces kept are made")

        let message = Array("eyJ0eXAiOiJkcG9wK2p3dCJ9.e30".utf8)
        var rs: Set<[UInt8]> = []
        let half = P256Signer.presignatureCapacity / 2
        for round in 0...P256Signer.presignatureCapacity {
            #expect(signer.hasPresignature == (round < P256Signer.presignatureCapacity))
            if round == half - 1 { #expect(!signer.claimPresigning(), "more than half the nonces are ready") }
            if round == half { #expect(signer.claimPresigning(), "half are used: time to make more") }
            let signature = try #require(signer.sign(message))
            let parsed = try P256.Signing.ECDSASignature(rawRepresentation: signature)
            #expect(publicKey.isValidSignature(parsed, for: Data(message)), "signature \(round)")
            #expect(!publicKey.isValidSignature(parsed, for: Data(message + [0x2e])), "a signature of another message")
            rs.insert(Array(signature.prefix(32)))
        }
        #expect(rs.count == P256Signer.presignatureCapacity + 1, "every signature has a nonce of its own")
        signer.presign()
        #expect(signer.hasPresignature && !signer.claimPresigning(), "made again")
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
