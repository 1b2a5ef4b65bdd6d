import CSodium
import FoundationEssentials

/// The broker's only door to libsodium: guarded key memory, XChaCha20-Poly1305, random bytes and SHA-256.
enum Sodium {
    static let keyLength = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    static let nonceLength = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    static let tagLength = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)

    /// Initialises libsodium once; safe to call from any thread.
    static let ready: Bool = sodium_init() >= 0

    /// `count` random bytes from libsodium's CSPRNG.
    static func randomBytes(_ count: Int) -> [UInt8] {
        precondition(ready, "libsodium failed to initialise")
        var bytes = [UInt8](repeating: 0, count: count)
        randombytes_buf(&bytes, count)
        return bytes
    }

    /// The SHA-256 digest of `bytes` (the PKCE S256 challenge, RFC 7636 section 4.2).
    static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        precondition(ready, "libsodium failed to initialise")
        var digest = [UInt8](repeating: 0, count: Int(crypto_hash_sha256_BYTES))
        crypto_hash_sha256(&digest, bytes, UInt64(bytes.count))
        return digest
    }

    /// Overwrites `data` with zeros in a way the compiler cannot elide.
    static func wipe(_ data: inout Data) {
        let count = data.count
        data.withUnsafeMutableBytes { sodium_memzero($0.baseAddress, count) }
    }

    /// Encrypts `plaintext` bound to `associatedData`; returns ciphertext with its tag.
    static func seal(_ plaintext: Data, associatedData: [UInt8], nonce: [UInt8], key: SecretKey) -> Data {
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count + tagLength)
        var written: UInt64 = 0
        let input = [UInt8](plaintext)
        let result = key.withBytes { keyBytes in
            crypto_aead_xchacha20poly1305_ietf_encrypt(
                &ciphertext, &written, input, UInt64(input.count),
                associatedData, UInt64(associatedData.count), nil, nonce, keyBytes)
        }
        precondition(result == 0, "XChaCha20-Poly1305 encryption cannot fail")
        return Data(ciphertext)
    }

    /// Decrypts and authenticates; `nil` when the key is wrong or any byte was changed.
    static func open(_ ciphertext: [UInt8], associatedData: [UInt8], nonce: [UInt8], key: SecretKey) -> Data? {
        guard ciphertext.count >= tagLength else { return nil }
        var plaintext = [UInt8](repeating: 0, count: max(1, ciphertext.count - tagLength))
        defer { sodium_memzero(&plaintext, plaintext.count) }
        var written: UInt64 = 0
        let result = key.withBytes { keyBytes in
            crypto_aead_xchacha20poly1305_ietf_decrypt(
                &plaintext, &written, nil, ciphertext, UInt64(ciphertext.count),
                associatedData, UInt64(associatedData.count), nonce, keyBytes)
        }
        return result == 0 ? Data(plaintext.prefix(Int(written))) : nil
    }
}

/// A symmetric key held in libsodium guarded memory: locked in RAM, read-only
/// outside of use, wiped when freed.
public final class SecretKey: @unchecked Sendable {
    private let pointer: UnsafeMutableRawPointer

    /// Copies `bytes` into guarded memory; the caller should wipe its own copy.
    init?(bytes: some ContiguousBytes) {
        guard Sodium.ready, let memory = sodium_malloc(Sodium.keyLength) else { return nil }
        let copied = bytes.withUnsafeBytes { raw in
            guard raw.count == Sodium.keyLength, let base = raw.baseAddress else { return false }
            memory.copyMemory(from: base, byteCount: raw.count)
            return true
        }
        guard copied else {
            sodium_free(memory)
            return nil
        }
        sodium_mprotect_readonly(memory)
        pointer = memory
    }

    deinit { sodium_free(pointer) }

    func withBytes<T>(_ body: (UnsafePointer<UInt8>) -> T) -> T {
        body(pointer.assumingMemoryBound(to: UInt8.self))
    }
}
