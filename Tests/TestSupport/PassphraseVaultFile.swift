import CSodium
import Foundation

/// A vault file seen from outside, as a test checks it: its format version, and the key a
/// passphrase derives under its format 3 header (Argon2id 1.3 with the passes, memory and salt
/// stored there, as brokerd derives it), so a test can search the files for that key.
public enum PassphraseVaultFile {
    /// The format version of the snapshot at `path` (2: the key file, 3: a passphrase).
    public static func version(at path: String) -> UInt16? {
        guard let bytes = FileManager.default.contents(atPath: path), bytes.count >= 10 else { return nil }
        return UInt16(bytes[8]) << 8 | UInt16(bytes[9])
    }

    /// The 32-byte key `passphrase` derives under the header of the format 3 snapshot at `path`.
    public static func key(at path: String, passphrase: String) throws -> Data {
        guard let bytes = FileManager.default.contents(atPath: path).map(Array.init), bytes.count >= 43,
            version(at: path) == 3, bytes[10] == 1
        else { throw HarnessError("\(path) is not a passphrase vault") }
        let number = { (offset: Int) in (offset..<offset + 8).reduce(UInt64(0)) { $0 << 8 | UInt64(bytes[$1]) } }
        let salt = Array(bytes[27..<43])
        var key = [UInt8](repeating: 0, count: 32)
        let text = Array(passphrase.utf8)
        guard sodium_init() >= 0,
            crypto_pwhash(
                &key, 32, text.map { CChar(bitPattern: $0) }, UInt64(text.count), salt, number(11), Int(number(19)),
                crypto_pwhash_alg_argon2id13()) == 0
        else { throw HarnessError("Argon2id failed") }
        return Data(key)
    }
}
