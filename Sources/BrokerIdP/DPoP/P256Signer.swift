import BrokerModel
import BrokerProtocol
import BrokerSecrets
import COpenSSL
import FoundationEssentials
import Logging
import Synchronization

/// An ES256 signing key held by OpenSSL's libcrypto for as long as the broker holds the key,
/// its private scalar in OpenSSL's secure heap (locked pages between guard pages, left out of
/// core dumps, cleared when freed).
///
/// Why OpenSSL and not swift-crypto: libcrypto keeps its keys in a secure heap, and its key
/// object is made once; swift-crypto can do neither, and rebuilding its key from the scalar
/// for each signature derived the public key every time. Each signature is made whole
/// (`EVP_PKEY_sign` of the message's SHA-256) with libcrypto's hedged nonce (drawn from the random source, the private
/// key and the message); nothing of a signature is computed ahead or kept (docs/dpop.md,
/// "Signing").
///
/// Unchecked `Sendable`: the `EVP_PKEY` is not changed after `init`, and libcrypto signs with
/// one key from several threads at once, each signature with a context of its own.
package final class P256Signer: @unchecked Sendable {
    private let key: OpaquePointer
    /// The public key's coordinates, 32 bytes of `x` then 32 of `y`.
    package let publicKey: [UInt8]
    /// Contexts ready to sign with `key`, kept between signatures.
    private let contexts = SignContexts()

    /// A key with the private scalar `raw` (32 bytes, big-endian). Throws when it is not a P-256
    /// private key (zero, or not below the group's order), or when the secure heap is full.
    package init(scalar raw: some ContiguousBytes) throws(BrokerFailure) {
        try Self.startSecureHeap()
        guard raw.withUnsafeBytes({ $0.count }) == 32 else { throw Self.notAKey }
        guard let group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1) else { throw Self.outOfMemory }
        defer { EC_GROUP_free(group) }
        guard let scalar = BN_secure_new() else { throw Self.outOfMemory }
        defer { BN_clear_free(scalar) }
        guard let point = EC_POINT_new(group) else { throw Self.outOfMemory }
        defer { EC_POINT_free(point) }
        defer { Sodium.wipeStack(Self.stackWiped) }
        // A private key is a scalar from 1 to the group's order less one.
        guard raw.withUnsafeBytes({ BN_bin2bn($0.baseAddress, 32, scalar) }) != nil else { throw Self.outOfMemory }
        guard BN_is_zero(scalar) == 0, BN_cmp(scalar, EC_GROUP_get0_order(group)) < 0 else { throw Self.notAKey }
        // Its public key is derived once, here, and given to libcrypto with the scalar.
        var encoded = [UInt8](repeating: 0, count: 65)
        let length = encoded.withUnsafeMutableBufferPointer {
            EC_POINT_mul(group, point, scalar, nil, nil, nil) == 1
                ? EC_POINT_point2oct(group, point, POINT_CONVERSION_UNCOMPRESSED, $0.baseAddress, 65, nil) : 0
        }
        guard length == 65, encoded[0] == 4, let key = Self.key(scalar: scalar, publicPoint: encoded) else {
            throw Self.outOfMemory
        }
        self.key = key
        self.publicKey = Array(encoded[1...])
    }

    /// A new key from libsodium's random source, with its private scalar written to `scalar`
    /// (32 bytes) for the vault.
    package static func generate(scalar: inout [UInt8]) throws(BrokerFailure) -> P256Signer {
        guard scalar.count == 32 else { throw notAKey }
        // Random 32 bytes are a private key but for about 1 in 2^32 (zero, or not below the
        // order): drawn again then.
        while true {
            Sodium.fillRandom(&scalar)
            do {
                return try P256Signer(scalar: scalar)
            } catch  where error == notAKey {
                continue
            }
        }
    }

    deinit { EVP_PKEY_free(key) }

    /// The ES256 signature of `message` (RFC 7518 section 3.4: `r` then `s`, 32 bytes each),
    /// made whole; `nil` when libcrypto fails. Tens of microseconds: call it where blocking is
    /// allowed (the signing threads), not on an event loop.
    ///
    /// The message is hashed here and libcrypto signs the digest (`EVP_PKEY_sign`) with a
    /// context of this key that was made ready once and is reused: setting one up for each
    /// signature (`EVP_DigestSignInit`) cost about a fifth of a signature's time. A context
    /// holds the key and the algorithm, nothing of a signature: its nonce is drawn inside
    /// `EVP_PKEY_sign` and freed before it returns (a nonce set ahead in a context, libcrypto's
    /// known-answer tests' way, is never used here).
    package func sign(_ message: [UInt8]) -> [UInt8]? {
        let digest = Sodium.sha256(message)
        guard let context = contexts.take(for: key) else { return nil }
        defer { Sodium.wipeStack(Self.stackWiped) }
        var der = [UInt8](repeating: 0, count: Self.derLimit)
        var length = der.count
        guard EVP_PKEY_sign(context.pointer, &der, &length, digest, digest.count) == 1 else {
            // Whatever state a failure left it in, the context is not used again.
            context.free()
            return nil
        }
        contexts.putBack(context)
        return Self.rawSignature(der: der.prefix(length))
    }

    /// The longest DER `ECDSA-Sig-Value` of P-256: a sequence of two integers of 33 bytes at most.
    private static let derLimit = 72

    /// `r` then `s`, 32 bytes each, of a DER `ECDSA-Sig-Value` (`SEQUENCE { INTEGER r, INTEGER
    /// s }`, short lengths only, as P-256's are); `nil` when `der` is not one.
    package static func rawSignature(der: ArraySlice<UInt8>) -> [UInt8]? {
        var rest = der
        guard rest.popFirst() == 0x30, let length = rest.popFirst(), Int(length) == rest.count else { return nil }
        var raw: [UInt8] = []
        raw.reserveCapacity(64)
        for _ in 0..<2 {
            guard rest.popFirst() == 0x02, let count = rest.popFirst().map(Int.init), count >= 1, count <= 33,
                count <= rest.count
            else { return nil }
            var integer = rest.prefix(count)
            rest = rest.dropFirst(count)
            // A leading zero keeps a DER integer positive; the value is at most 32 bytes.
            if integer.count == 33 {
                guard integer.first == 0 else { return nil }
                integer = integer.dropFirst()
            }
            raw += repeatElement(0, count: 32 - integer.count)
            raw += integer
        }
        return rest.isEmpty ? raw : nil
    }

    /// libcrypto's key object for `scalar` (in the secure heap; its parameter copy is made
    /// there too and cleared when freed) and its uncompressed public point.
    private static func key(scalar: OpaquePointer, publicPoint: [UInt8]) -> OpaquePointer? {
        guard let builder = OSSL_PARAM_BLD_new() else { return nil }
        defer { OSSL_PARAM_BLD_free(builder) }
        let pushed = publicPoint.withUnsafeBytes { point in
            OSSL_PARAM_BLD_push_utf8_string(builder, COpenSSLGroupNameKey, COpenSSLP256, 0) == 1
                && OSSL_PARAM_BLD_push_BN(builder, COpenSSLPrivateKeyKey, scalar) == 1
                && OSSL_PARAM_BLD_push_octet_string(builder, COpenSSLPublicKeyKey, point.baseAddress, 65) == 1
        }
        guard pushed, let parameters = OSSL_PARAM_BLD_to_param(builder) else { return nil }
        defer { OSSL_PARAM_free(parameters) }
        guard let context = EVP_PKEY_CTX_new_from_name(nil, COpenSSLEC, nil) else { return nil }
        defer { EVP_PKEY_CTX_free(context) }
        var key: OpaquePointer?
        guard EVP_PKEY_fromdata_init(context) == 1,
            EVP_PKEY_fromdata(context, &key, COpenSSLKeyPair, parameters) == 1
        else { return nil }
        return key
    }

    private static let notAKey = BrokerFailure.invalid("the vault holds a DPoP key that is not a P-256 private key")
    private static let outOfMemory = BrokerFailure.outOfGuardedMemory

    /// Bytes of stack wiped after each use of the secret scalar (deriving the public key, a
    /// signature): more than OpenSSL's P-256 code uses, its point tables included.
    private static let stackWiped = 16 << 10

    /// The secure heap's size: the keys of about 16,000 accounts (64 bytes each, and a
    /// scalar and its parameter copy for a moment while a key is made).
    private static let secureHeapSize = 1 << 20

    /// What `CRYPTO_secure_malloc_init` answered (1: locked; 2: not locked; 0: no secure heap),
    /// `nil` before the first key.
    private static let secureHeap = Mutex<Int32?>(nil)

    /// Whether libcrypto's secure heap is locked in RAM, or not started (no DPoP key yet).
    package static var secureHeapLocked: Bool { secureHeap.withLock { $0 == nil || $0 == 1 } }

    /// Starts OpenSSL's secure heap, once, before the first key: from then on libcrypto keeps
    /// private scalars there (and a signature's nonce while it is made). When the locked-memory limit refuses to lock it, it
    /// still serves, unlocked, and that is logged once; without it no key is made.
    private static func startSecureHeap() throws(BrokerFailure) {
        let started = secureHeap.withLock { started in
            if let started { return started }
            // libcrypto's exit handler would free what signing threads may still be using.
            _ = OPENSSL_init_crypto(UInt64(OPENSSL_INIT_NO_ATEXIT), nil)
            let answer = CRYPTO_secure_malloc_init(secureHeapSize, 32)
            started = answer
            if answer == 2 {
                Logger(label: "brokerd").warning(
                    """
                    cannot lock DPoP keys in memory (mlock of OpenSSL's secure heap, 1 MiB, refused); they stay \
                    usable but may be swapped out; raise the locked-memory limit (RLIMIT_MEMLOCK, LimitMEMLOCK=)
                    """)
            }
            return answer
        }
        guard started != 0 else { throw .invalid("OpenSSL's secure heap for DPoP keys could not be mapped") }
    }
}
