import FoundationEssentials
import TestSupport
import Testing

@testable import BrokerCore

/// `SecretBytes` and its arena on their own: the bytes come back as given, compare by content,
/// never print, travel through JSON as a string, and a released secret's slot is wiped at once.
@Suite struct SecretBytesTests {
    static let text = "rt-" + String(repeating: "0123456789abcdef", count: 4)

    @Test(arguments: [0, 1, 31, 32, 33, 2048, 2049, 10_000])
    func bytesComeBackAsGivenAtEverySize(length: Int) {
        let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
        let secret = bytes.withUnsafeBytes { SecretBytes(bytes: $0) }
        #expect(secret.count == length)
        #expect(secret.withUnsafeBytes { Array($0) } == bytes)
    }

    @Test func equalByContent() {
        #expect(SecretBytes(Self.text) == SecretBytes(Self.text))
        #expect(SecretBytes(Self.text) != SecretBytes(Self.text + "x"))
        #expect(SecretBytes(Self.text) != SecretBytes(String(Self.text.dropLast()) + "X"))
        #expect(SecretBytes(Self.text).text == Self.text)
    }

    @Test func neverPrinted() {
        let secret = SecretBytes(Self.text)
        var dumped = ""
        dump(secret, to: &dumped)
        for shown in [
            "\(secret)", String(describing: secret), String(reflecting: secret), dumped,
            String(describing: AccountSecrets(refreshToken: secret)),
        ] {
            #expect(!shown.contains("0123456789"), "\(shown)")
            #expect(shown.contains("<secret>"), "\(shown)")
        }
    }

    @Test func codableAsAString() throws {
        let secrets = AccountSecrets(refreshToken: SecretBytes(Self.text), clientSecret: SecretBytes("cs"))
        let json = try JSONEncoder().encode(secrets)
        #expect(String(decoding: json, as: UTF8.self).contains("\"\(Self.text)\""))
        #expect(try JSONDecoder().decode(AccountSecrets.self, from: json) == secrets)
    }

    /// The slot of a released secret reads as zeros at once (slabs stay mapped, so reading it
    /// afterwards is safe). 1,500 bytes: a slot size no other test uses, so none takes it meanwhile.
    @Test func aReleasedSecretIsWipedAtOnce() {
        var secret: SecretBytes? = SecretBytes(String(repeating: Self.text, count: 22))
        let address = secret!.withUnsafeBytes { UInt(bitPattern: $0.baseAddress) }
        let count = secret!.count
        secret = nil
        let left = UnsafeRawBufferPointer(start: UnsafeRawPointer(bitPattern: address), count: count)
        #expect(count > 1024 && left.allSatisfy { $0 == 0 }, "the slot still holds the secret")
    }
}
