@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Crypto
import FoundationEssentials
import Testing
import TestSupport

/// The ES256 key DPoP proofs are signed with (docs/dpop.md, "Signing"), checked against
/// swift-crypto's P-256, another implementation: the public key it derives and the signatures it
/// verifies, each with a nonce of its own.
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

    @Test func everySignatureVerifiesAndSignsOnlyItsMessage() throws {
        var scalar = [UInt8](repeating: 0, count: 32)
        let signer = try P256Signer.generate(scalar: &scalar)
        let publicKey = try P256.Signing.PublicKey(rawRepresentation: signer.publicKey)
        for index in 0..<20 {
            let message = Array("eyJ0eXAiOiJkcG9wK2p3dCJ9.e30.\(index)".utf8)
            try Self.expectVerified(try #require(signer.sign(message)), message, publicKey)
        }
    }

    /// Each signature's nonce is made with it, never ahead: 100,000 signatures of one message
    /// from 64 threads at once (the same key, so that a nonce used twice would show as an `r`
    /// seen twice), every one of them verified.
    @Test func oneHundredThousandSignaturesFromSixtyFourThreadsShareNoNonce() async throws {
        var scalar = [UInt8](repeating: 0, count: 32)
        let signer = try P256Signer.generate(scalar: &scalar)
        let publicKey = try P256.Signing.PublicKey(rawRepresentation: signer.publicKey)
        let message = Array("eyJ0eXAiOiJkcG9wK2p3dCJ9.e30".utf8)
        let threads = 64
        let each = 100_000 / threads + 1
        let signatures = try await withThrowingTaskGroup(of: [[UInt8]].self) { group in
            for _ in 0..<threads {
                group.addTask {
                    try await onOwnThread { (0..<each).compactMap { _ in signer.sign(message) } }
                }
            }
            return try await group.reduce(into: [[UInt8]]()) { $0 += $1 }
        }
        #expect(signatures.count == threads * each, "libcrypto signed every time")
        #expect(Set(signatures.map { Array($0.prefix(32)) }).count == signatures.count, "no r seen twice")
        for signature in signatures.prefix(100) { try Self.expectVerified(signature, message, publicKey) }
        let parsed = try signatures.map { try P256.Signing.ECDSASignature(rawRepresentation: $0) }
        #expect(parsed.allSatisfy { publicKey.isValidSignature($0, for: Data(message)) })
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
