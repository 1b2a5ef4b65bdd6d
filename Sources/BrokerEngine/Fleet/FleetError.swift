import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault

/// A problem of the fleet (its shared store, a row, the fleet key), with a message that says
/// what to do; never contains a secret.
public struct FleetError: Error, CustomStringConvertible, Sendable {
    public let description: String
    /// The database answered the statement with an error: it did not take effect, and never
    /// will (rather than a call given up on or cut off, which may yet).
    public let refusedByServer: Bool

    public init(_ description: String, refusedByServer: Bool = false) {
        self.description = description
        self.refusedByServer = refusedByServer
    }
}
