import BrokerModel

/// A value a client sent, repeated in an error message: printable ASCII only, at most 64
/// characters. (Text from an IdP is cleaned by `OutsideText` instead, which also redacts the
/// account's secrets.)
package enum InputEcho {
    package static func printable(_ text: String) -> String {
        String(
            text.unicodeScalars.filter { $0.isASCII && $0.value >= 0x20 && $0.value < 0x7F }.prefix(64).map(
                Character.init))
    }
}
