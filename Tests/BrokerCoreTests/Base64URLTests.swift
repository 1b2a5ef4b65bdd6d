@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing

/// The hand-written base64url agrees with Foundation's base64 (RFC 4648 sections 4 and 5) on
/// every length, and refuses what is not base64url.
@Suite struct Base64URLTests {
    /// Foundation's encoding of `bytes`, made url-safe and unpadded.
    static func reference(_ bytes: [UInt8]) -> String {
        var text = Data(bytes).base64EncodedString()
        text = text.replacing("+", with: "-").replacing("/", with: "_")
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }

    @Test func agreesWithFoundationBothWays() {
        var generator = SystemRandomNumberGenerator()
        for length in 0..<200 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let text = Base64URL.encode(bytes)
            #expect(text == Self.reference(bytes), "length \(length)")
            #expect(Base64URL.decode(text).map(Array.init) == bytes, "length \(length)")
            var padded = text
            while padded.utf8.count % 4 != 0 { padded += "=" }
            #expect(Base64URL.decode(padded).map(Array.init) == bytes, "padded, length \(length)")
        }
        // RFC 4648 section 10's vectors.
        #expect(
            ["", "f", "fo", "foo", "foob", "fooba", "foobar"].map { Base64URL.encode(Array($0.utf8)) } == [
                "", "Zg", "Zm8", "Zm9v", "Zm9vYg", "Zm9vYmE", "Zm9vYmFy",
            ])
    }

    /// Non-zero bits after the last whole byte are refused (`Zh` would be `Zg`'s byte again).
    @Test(arguments: ["a+b_", "a/b-", "Zm9vY", "Zm9v====", "Zm=v", "Zm9v\n", "Zé9v", "=", "Zg=", "Z", "Zh", "Zm9"])
    func refusesWhatIsNotBase64URL(text: String) {
        #expect(Base64URL.decode(text) == nil)
    }
}
