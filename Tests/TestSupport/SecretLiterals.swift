import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault

/// Lets a test write a secret as a literal (`refreshToken: "rt-1"`) and compare with one.
extension SecretBytes: ExpressibleByStringLiteral {
    public convenience init(stringLiteral value: String) { try! self.init(value) }
}
