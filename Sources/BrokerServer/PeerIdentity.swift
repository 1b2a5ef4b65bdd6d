#if canImport(Glibc)
import Glibc
#endif

/// Who is on the other end of a connection, from `SO_PEERCRED` (kernel-attested).
public struct PeerIdentity: Sendable, Equatable, CustomStringConvertible {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32

    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }

    public var description: String { "pid \(pid) uid \(uid)" }
}

/// Who may connect and who may use the owner operations (CONTRACT section 5).
public struct AccessPolicy: Sendable {
    /// The broker's own uid: the owner.
    public var ownerUID: UInt32

    public init(ownerUID: UInt32 = getuid()) { self.ownerUID = ownerUID }

    /// Only the owner and root may connect at all.
    public func mayConnect(_ peer: PeerIdentity) -> Bool { peer.uid == ownerUID || peer.uid == 0 }

    /// Owner operations are for the owner's uid only.
    public func isAdmin(_ peer: PeerIdentity) -> Bool { peer.uid == ownerUID }
}
