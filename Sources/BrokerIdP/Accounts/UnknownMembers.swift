import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// The members of a vault object (an account, its `secrets`, its `token`) that this release
/// does not know: a later release's fields, kept byte for byte so that every rewrite gives them
/// back (protocol/VAULT.md, "Records of other releases"). Held in guarded memory like the
/// record's secrets, since they may be keys; never printed.
public struct UnknownMembers: Sendable, Equatable, CustomStringConvertible {
    /// Their JSON text as read (`"key":value`, each from its key's quote to its value's end),
    /// in their order, joined by commas.
    package let text: SecretBytes

    /// The members whose texts are `members`, in that order.
    package init(_ members: [UnsafeRawBufferPointer]) throws(BrokerFailure) {
        var joined: [UInt8] = []
        defer { Sodium.wipe(&joined) }
        joined.reserveCapacity(members.reduce(members.count) { $0 + $1.count })
        for member in members {
            if !joined.isEmpty { joined.append(UInt8(ascii: ",")) }
            joined += member
        }
        let stored = joined.withUnsafeBytes { bytes in
            Result { () throws(BrokerFailure) in try SecretBytes(bytes: bytes) }
        }
        text = try stored.get()
    }

    public var description: String { "<unknown members>" }
}
