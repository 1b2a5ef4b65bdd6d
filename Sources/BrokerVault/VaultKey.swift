import BrokerIdP
import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// Finds or creates the vault key file (docs/install.md, "Files").
public enum VaultKey {
    /// Reads the 32-byte key at `path` (see `SecretKeyFile`); when `create` is set and no file
    /// exists, makes one with fresh random bytes, mode 0600, in a private directory.
    public static func load(path: String, create: Bool) throws -> SecretKey {
        if let key = try SecretKeyFile.read(path, role: "vault key", refuse: { VaultError($0) }) { return key }
        guard create else { throw VaultError("no vault key at \(path)") }
        return try SecretKeyFile.create(
            at: path, role: "vault key",
            remedy: "set TOKENBROKER_KEY_FILE (or --key-file) to a path in a directory only you can write",
            refuse: { VaultError($0) })
    }
}
