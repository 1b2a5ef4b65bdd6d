import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
#if canImport(Glibc)
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Glibc
#endif

/// The fleet key: the one secret the brokers of a fleet share. It seals every shared account's
/// row (`SharedRecord`) and the store's canary (`FleetCanary`), so whoever runs the database
/// reads no secret (docs/fleet.md). A file of exactly 32 random bytes, private like the vault
/// key (`SecretKeyFile`); the same file copied to another host is the same key.
public enum FleetKey {
    /// Writes a new fleet key to `path`; refuses a path where a file already is (a fleet key is
    /// never overwritten: every row sealed with it would be lost).
    @discardableResult
    public static func create(at path: String) throws -> SecretKey {
        var info = stat()
        guard lstat(path, &info) != 0 else {
            throw FleetError("\(path) exists already; a fleet key is never overwritten (choose another path)")
        }
        return try SecretKeyFile.create(
            at: path, role: "fleet key", remedy: "choose a path in a directory only you can write",
            refuse: { FleetError($0) })
    }

    /// Reads the fleet key at `path`.
    public static func load(path: String) throws -> SecretKey {
        guard let key = try SecretKeyFile.read(path, role: "fleet key", refuse: { FleetError($0) }) else {
            throw FleetError("no fleet key at \(path): copy the fleet's key there (brokerctl fleet init made it)")
        }
        return key
    }
}
