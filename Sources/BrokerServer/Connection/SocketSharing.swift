import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault

#if canImport(Glibc)
import Glibc
#endif

/// Opens the socket brokerd bound itself to the group `[broker] socket_group` names, with the
/// mode `[broker] socket_mode` gives, so that other users an account lists can connect (under
/// socket activation, `SocketGroup=` and `SocketMode=` do this).
enum SocketSharing {
    /// Gives the socket at `path`, just bound 0600 in a directory only this uid can write, its
    /// group and then its mode; nothing to do for the default (no group, 0600).
    static func share(_ path: String, rules: AccessRules) throws {
        if let group = rules.socketGroup {
            let gid = try groupID(group)
            guard lchown(path, uid_t.max, gid) == 0 else {
                throw ServerError(
                    description:
                        "cannot give the socket \(path) the group \(group): \(String(cString: strerror(errno))) "
                        + "(brokerd's user must be a member of it)")
            }
        }
        guard rules.socketMode != 0o600 else { return }
        guard chmod(path, mode_t(rules.socketMode)) == 0 else {
            throw ServerError(
                description: "cannot set the mode of the socket \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// The gid of a group given by name or by number.
    private static func groupID(_ name: String) throws -> gid_t {
        if let number = UInt32(name), number < UInt32.max { return number }
        var entry = group()
        var found: UnsafeMutablePointer<group>?
        var buffer = [CChar](repeating: 0, count: 64 * 1024)
        let status = getgrnam_r(name, &entry, &buffer, buffer.count, &found)
        guard status == 0, found != nil else {
            throw ServerError(description: "broker.socket_group: there is no group \"\(name)\"")
        }
        return entry.gr_gid
    }
}
