import BrokerModel
import CSodium
import FoundationEssentials

/// The broker's only door to libsodium: guarded key memory, XChaCha20-Poly1305, Argon2id, random
/// bytes, SHA-256 and stack wiping. (Other secrets live in `SecretArena`'s own guarded pages.)
package enum Sodium {
    package static let keyLength = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    package static let nonceLength = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    package static let tagLength = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)

    /// Initialises libsodium once; safe to call from any thread.
    package static let ready: Bool = sodium_init() >= 0

    /// `count` random bytes from libsodium's CSPRNG.
    package static func randomBytes(_ count: Int) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        fillRandom(&bytes)
        return bytes
    }

    /// Overwrites `bytes` with random bytes from libsodium's CSPRNG, in place (a secret's own
    /// buffer, which no copy may leave behind).
    package static func fillRandom(_ bytes: inout [UInt8]) {
        precondition(ready, "libsodium failed to initialise")
        randombytes_buf(&bytes, bytes.count)
    }

    /// Zeroes `count` bytes of the stack below the caller's frame: where a function that just
    /// returned may have left a secret (OpenSSL's P-256 code copies scalars and nonces there).
    package static func wipeStack(_ count: Int) { sodium_stackzero(count) }

    /// `bytes` as lowercase hex digits.
    package static func hex(_ bytes: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        return String(decoding: bytes.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 15)]] }, as: UTF8.self)
    }

    /// The SHA-256 digest of `bytes` (the PKCE S256 challenge, RFC 7636 section 4.2).
    package static func sha256(_ bytes: [UInt8]) -> [UInt8] { bytes.withUnsafeBytes { sha256($0) } }

    /// The SHA-256 digest of `bytes` where they lie (a secret's, without a copy).
    package static func sha256(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        precondition(ready, "libsodium failed to initialise")
        var digest = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
        crypto_hash_sha256(&digest, bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(bytes.count))
        return digest
    }

    package static let saltLength = Int(crypto_pwhash_argon2id_saltbytes())
    /// libsodium's interactive-use floor for Argon2id (3 passes over 256 MiB), and its ceiling
    /// for sensitive data (4 passes over 1 GiB).
    package static let argon2idModerate = (
        passes: UInt64(crypto_pwhash_argon2id_opslimit_moderate()),
        memory: UInt64(crypto_pwhash_argon2id_memlimit_moderate())
    )
    package static let argon2idSensitive = (
        passes: UInt64(crypto_pwhash_argon2id_opslimit_sensitive()),
        memory: UInt64(crypto_pwhash_argon2id_memlimit_sensitive())
    )

    /// The key Argon2id (version 1.3) derives from `passphrase` and `salt`, made in guarded
    /// memory; `nil` when libsodium cannot (out of memory) or `passphrase` is empty. Takes about a second at the
    /// moderate limits: call it off the broker's actor.
    package static func argon2id(_ passphrase: [UInt8], salt: [UInt8], passes: UInt64, memory: UInt64) -> SecretKey? {
        precondition(ready, "libsodium failed to initialise")
        precondition(salt.count == saltLength, "an Argon2id salt is \(saltLength) bytes")
        guard let memory = Int(exactly: memory), !passphrase.isEmpty else { return nil }
        return SecretKey { key in
            passphrase.withUnsafeBytes { text in
                crypto_pwhash(
                    key, UInt64(keyLength), text.baseAddress!.assumingMemoryBound(to: CChar.self), UInt64(text.count),
                    salt, passes, memory, crypto_pwhash_alg_argon2id13()) == 0
            }
        }
    }

    /// Whether `count` bytes at `lhs` and `rhs` are equal, in time that does not depend on them.
    package static func constantTimeEqual(_ lhs: UnsafeRawPointer, _ rhs: UnsafeRawPointer, count: Int) -> Bool {
        sodium_memcmp(lhs, rhs, count) == 0
    }

    /// Overwrites `bytes` with zeros in a way the compiler cannot elide.
    package static func wipe(_ bytes: UnsafeMutableRawBufferPointer) {
        sodium_memzero(bytes.baseAddress, bytes.count)
    }

    /// Overwrites `data` with zeros in a way the compiler cannot elide.
    package static func wipe(_ data: inout Data) {
        let count = data.count
        data.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, count) }
    }

    /// Overwrites `bytes` with zeros in a way the compiler cannot elide.
    package static func wipe(_ bytes: inout [UInt8]) {
        let count = bytes.count
        bytes.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, count) }
    }

    /// Encrypts `plaintext` bound to `associatedData`; returns ciphertext with its tag.
    package static func seal(_ plaintext: some ContiguousBytes, associatedData: [UInt8], nonce: [UInt8], key: SecretKey)
        -> Data
    {
        let count = plaintext.withUnsafeBytes { $0.count }
        var ciphertext = [UInt8](repeating: 0, count: count + tagLength)
        var written: UInt64 = 0
        let result = plaintext.withUnsafeBytes { input in
            key.withBytes { keyBytes in
                crypto_aead_xchacha20poly1305_ietf_encrypt(
                    &ciphertext, &written, input.bindMemory(to: UInt8.self).baseAddress, UInt64(count),
                    associatedData, UInt64(associatedData.count), nil, nonce, keyBytes)
            }
        }
        precondition(result == 0, "XChaCha20-Poly1305 encryption cannot fail")
        return Data(ciphertext)
    }

    /// Decrypts and authenticates; `nil` when the key is wrong or any byte was changed. The
    /// plaintext is written once, straight into the array returned (which the caller wipes).
    package static func open(
        _ ciphertext: some ContiguousBytes, associatedData: [UInt8], nonce: [UInt8], key: SecretKey
    )
        -> [UInt8]?
    {
        ciphertext.withUnsafeBytes { ciphertext in
            guard ciphertext.count >= tagLength, let input = ciphertext.baseAddress else { return nil }
            let capacity = max(1, ciphertext.count - tagLength)
            var authentic = false
            let plaintext = [UInt8](unsafeUninitializedCapacity: capacity) { buffer, initialized in
                var written: UInt64 = 0
                let result = key.withBytes { keyBytes in
                    crypto_aead_xchacha20poly1305_ietf_decrypt(
                        buffer.baseAddress, &written, nil, input.assumingMemoryBound(to: UInt8.self),
                        UInt64(ciphertext.count),
                        associatedData, UInt64(associatedData.count), nonce, keyBytes)
                }
                authentic = result == 0
                guard authentic else {
                    sodium_memzero(buffer.baseAddress, capacity)
                    initialized = 0
                    return
                }
                initialized = Int(written)
            }
            return authentic ? plaintext : nil
        }
    }
}

/// A symmetric key held in libsodium guarded memory: locked in RAM, read-only
/// outside of use, wiped when freed.
public final class SecretKey: @unchecked Sendable {
    private let pointer: UnsafeMutableRawPointer

    /// Copies `bytes` into guarded memory; the caller should wipe its own copy.
    package convenience init?(bytes: some ContiguousBytes) {
        self.init { key in
            bytes.withUnsafeBytes { raw in
                guard raw.count == Sodium.keyLength, let base = raw.baseAddress else { return false }
                key.update(from: base.assumingMemoryBound(to: UInt8.self), count: raw.count)
                return true
            }
        }
    }

    /// A key that `fill` writes into guarded memory of `Sodium.keyLength` bytes; `nil` when it
    /// returns `false` (the memory is wiped and freed) or no memory could be locked.
    package init?(filling fill: (UnsafeMutablePointer<UInt8>) -> Bool) {
        guard Sodium.ready, let memory = sodium_malloc(Sodium.keyLength) else { return nil }
        guard fill(memory.bindMemory(to: UInt8.self, capacity: Sodium.keyLength)) else {
            sodium_free(memory)
            return nil
        }
        sodium_mprotect_readonly(memory)
        pointer = memory
    }

    deinit { sodium_free(pointer) }

    package func withBytes<T>(_ body: (UnsafePointer<UInt8>) -> T) -> T {
        body(pointer.assumingMemoryBound(to: UInt8.self))
    }
}
