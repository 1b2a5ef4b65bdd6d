/// A problem of the fleet (its shared store, a row, the fleet key), with a message that says
/// what to do; never contains a secret.
public struct FleetError: Error, CustomStringConvertible, Sendable {
    public let description: String

    public init(_ description: String) { self.description = description }
}
