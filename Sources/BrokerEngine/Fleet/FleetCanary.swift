import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// The store's canary: a fixed text sealed with the fleet key when the store is made. A broker
/// whose key does not open it holds another fleet's key, and stops before it writes anything
/// (docs/fleet.md).
public enum FleetCanary {
    package static let text = Array("tokenbroker fleet canary".utf8)
    package static let associatedData = Array("tokenbroker fleet canary\u{0}1".utf8)

    /// A new canary for `key`: the nonce, then the sealed text.
    public static func make(key: SecretKey) -> [UInt8] {
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        return nonce + Array(Sodium.seal(Data(text), associatedData: associatedData, nonce: nonce, key: key))
    }

    /// Whether `canary` opens under `key` to the canary's text.
    public static func opens(_ canary: [UInt8], key: SecretKey) -> Bool {
        guard canary.count > Sodium.nonceLength else { return false }
        let nonce = Array(canary.prefix(Sodium.nonceLength))
        guard
            let text = Sodium.open(
                canary.dropFirst(Sodium.nonceLength), associatedData: associatedData, nonce: nonce, key: key)
        else { return false }
        return text == Self.text
    }
}
