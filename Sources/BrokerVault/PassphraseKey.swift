import BrokerIdP
import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// How the vault key is obtained (`[broker] key` in broker.toml, `brokerd --passphrase`, the
/// `to` of `rekey`).
public enum VaultKeyMode: String, Sendable, CaseIterable {
    /// A random 32-byte key in a file beside the config (or a systemd credential).
    case keyFile = "keyfile"
    /// A key derived from a passphrase that the user types at `brokerctl unlock`, held only in memory.
    case passphrase
}

/// Where the vault's key file is, and whether brokerd may create or remove it (a systemd
/// credential is read-only).
public struct KeyFile: Sendable, Equatable {
    public var path: String
    public var isCredential: Bool

    public init(path: String, isCredential: Bool) {
        self.path = path
        self.isCredential = isCredential
    }
}

/// The Argon2id (version 1.3) settings that turn a passphrase into the vault key: its passes,
/// its memory and its salt, stored in the snapshot header (which the ciphertext authenticates).
///
/// Encoded as a 1-byte algorithm number (1: Argon2id 1.3), the 8-byte passes, the 8-byte memory
/// in bytes and the 16-byte salt, big-endian. Limits outside libsodium's moderate to sensitive
/// range are refused when read: fewer would weaken the vault against an offline guess, more
/// would let a planted header make an unlock take minutes and gigabytes.
public struct KeyDerivation: Sendable, Equatable {
    package static let algorithmArgon2id13: UInt8 = 1
    package static let encodedLength = 1 + 8 + 8 + Sodium.saltLength

    package var passes: UInt64
    package var memory: UInt64
    package var salt: [UInt8]

    /// A fresh random salt with libsodium's moderate limits (3 passes over 256 MiB).
    package static func fresh() -> KeyDerivation {
        KeyDerivation(
            passes: Sodium.argon2idModerate.passes, memory: Sodium.argon2idModerate.memory,
            salt: Sodium.randomBytes(Sodium.saltLength))
    }

    /// The settings as the header stores them.
    package var bytes: [UInt8] {
        var bytes = [Self.algorithmArgon2id13]
        bytes.append(bigEndian: passes)
        bytes.append(bigEndian: memory)
        return bytes + salt
    }

    /// Reads the settings stored at `offset` in `header`, which holds at least `encodedLength`
    /// bytes from there; `nil` for an unknown algorithm or limits outside the accepted range.
    package static func read(_ header: [UInt8], at offset: Int) -> KeyDerivation? {
        guard header.count >= offset + encodedLength, header[offset] == algorithmArgon2id13 else { return nil }
        let derivation = KeyDerivation(
            passes: header.bigEndian(UInt64.self, at: offset + 1),
            memory: header.bigEndian(UInt64.self, at: offset + 9),
            salt: Array(header[(offset + 17)..<(offset + encodedLength)]))
        let passes = Sodium.argon2idModerate.passes...Sodium.argon2idSensitive.passes
        let memory = Sodium.argon2idModerate.memory...Sodium.argon2idSensitive.memory
        guard passes.contains(derivation.passes), memory.contains(derivation.memory) else { return nil }
        return derivation
    }
}

/// A vault key derived from a passphrase, with the settings that derived it.
public struct PassphraseKey: Sendable {
    package let key: SecretKey
    package let derivation: KeyDerivation

    /// Derives the key of `passphrase` with `derivation` (about a second, and its memory limit
    /// in RAM: call it off the broker's actor, one at a time).
    package static func derive(_ passphrase: [UInt8], with derivation: KeyDerivation) throws -> PassphraseKey {
        guard
            let key = Sodium.argon2id(
                passphrase, salt: derivation.salt, passes: derivation.passes, memory: derivation.memory)
        else { throw VaultError("cannot derive the vault key from the passphrase: out of memory") }
        return PassphraseKey(key: key, derivation: derivation)
    }
}

/// The key a vault is sealed with.
package enum SealingKey {
    /// The key of the key file (snapshot format 2).
    case keyFile(SecretKey)
    /// A key derived from a passphrase (snapshot format 3, whose header holds the derivation).
    case passphrase(PassphraseKey)

    package var secret: SecretKey {
        switch self {
        case .keyFile(let key): return key
        case .passphrase(let passphrase): return passphrase.key
        }
    }

    /// How the key was derived from a passphrase; `nil` for the key file's.
    package var derivation: KeyDerivation? {
        guard case .passphrase(let passphrase) = self else { return nil }
        return passphrase.derivation
    }

    package var mode: VaultKeyMode {
        switch self {
        case .keyFile: return .keyFile
        case .passphrase: return .passphrase
        }
    }
}
