import BrokerProtocol
import COpenSSL
import Logging
import Synchronization

/// An ES256 signing key held by OpenSSL's libcrypto for as long as the broker holds the key,
/// its private scalar in OpenSSL's secure heap (locked pages between guard pages, left out of
/// core dumps, cleared when freed), with a few signatures' nonces computed ahead.
///
/// Why OpenSSL and not swift-crypto: an ECDSA signature is mostly the nonce's work (`k·G` and
/// `k⁻¹`), which does not depend on the message. libcrypto can do that part ahead
/// (`ECDSA_sign_setup`) and finish a signature with it in under a microsecond
/// (`ECDSA_do_sign_ex`), and keeps its keys in a secure heap; swift-crypto can do neither, and
/// rebuilding its key from the scalar for each signature derived the public key every time.
/// A program's proof then costs the broker about what a plain token does (docs/dpop.md,
/// "Signing"); the precomputed nonces are made on another thread between requests.
///
/// Unchecked `Sendable`: the `EC_KEY` is not changed after `init`, and libcrypto signs with one
/// key from several threads at once; the rest is behind a `Mutex`.
final class P256Signer: @unchecked Sendable {
    /// How many signatures' nonces are kept ready: enough for a burst of requests.
    static let presignatureCapacity = 16

    private let key: OpaquePointer
    /// The public key's coordinates, 32 bytes of `x` then 32 of `y`.
    let publicKey: [UInt8]
    private let ready = Mutex(Ready())

    /// The nonces ready for the next signatures, and whether a thread is making more.
    private struct Ready: ~Copyable {
        var presignatures: [Presignature] = []
        var filling = false
    }

    /// A key with the private scalar `raw` (32 bytes, big-endian); `nil` when it is not a valid
    /// P-256 private key (zero, or not below the group's order).
    init?(scalar raw: UnsafeRawBufferPointer) {
        Self.secureHeapStarted()
        guard raw.count == 32, let key = EC_KEY_new_by_curve_name(NID_X9_62_prime256v1) else { return nil }
        guard let scalar = BN_secure_new() else {
            EC_KEY_free(key)
            return nil
        }
        defer { BN_clear_free(scalar) }
        let group = EC_KEY_get0_group(key)
        guard let point = EC_POINT_new(group) else {
            EC_KEY_free(key)
            return nil
        }
        defer { EC_POINT_free(point) }
        // A private key is a scalar from 1 to the group's order less one; its public key is
        // derived once, here (`EC_KEY_check_key` would derive it a second time to compare).
        defer { Sodium.wipeStack(Self.stackWiped) }
        guard BN_bin2bn(raw.baseAddress, 32, scalar) != nil, BN_is_zero(scalar) == 0,
            BN_cmp(scalar, EC_GROUP_get0_order(group)) < 0, EC_KEY_set_private_key(key, scalar) == 1,
            EC_POINT_mul(group, point, scalar, nil, nil, nil) == 1, EC_KEY_set_public_key(key, point) == 1,
            let publicKey = Self.coordinates(key)
        else {
            EC_KEY_free(key)
            return nil
        }
        self.key = key
        self.publicKey = publicKey
    }

    /// A new key from OpenSSL's random source, with its private scalar written to `scalar` (32
    /// bytes) for the vault.
    static func generate(scalar: UnsafeMutableRawBufferPointer) -> P256Signer? {
        secureHeapStarted()
        guard scalar.count == 32, let key = EC_KEY_new_by_curve_name(NID_X9_62_prime256v1) else { return nil }
        defer {
            EC_KEY_free(key)
            Sodium.wipeStack(stackWiped)
        }
        guard EC_KEY_generate_key(key) == 1, let made = EC_KEY_get0_private_key(key),
            BN_bn2binpad(made, scalar.baseAddress, 32) == 32
        else { return nil }
        return P256Signer(scalar: UnsafeRawBufferPointer(scalar))
    }

    deinit { EC_KEY_free(key) }

    /// The ES256 signature of `message` (RFC 7518 section 3.4: `r` then `s`, 32 bytes each), with
    /// a nonce made ahead when one is ready.
    func sign(_ message: [UInt8]) -> [UInt8]? {
        let digest = Sodium.sha256(message)
        let presignature = ready.withLock { $0.presignatures.popLast() }
        defer { if presignature == nil { Sodium.wipeStack(Self.stackWiped) } }
        let signature = digest.withUnsafeBufferPointer { digest in
            if let presignature {
                return ECDSA_do_sign_ex(digest.baseAddress, 32, presignature.kinv, presignature.r, key)
            }
            return ECDSA_do_sign(digest.baseAddress, 32, key)
        }
        guard let signature else { return nil }
        defer { ECDSA_SIG_free(signature) }
        var r: OpaquePointer?
        var s: OpaquePointer?
        ECDSA_SIG_get0(signature, &r, &s)
        var raw = [UInt8](repeating: 0, count: 64)
        let written = raw.withUnsafeMutableBufferPointer { raw in
            BN_bn2binpad(r, raw.baseAddress, 32) == 32 && BN_bn2binpad(s, raw.baseAddress! + 32, 32) == 32
        }
        return written ? raw : nil
    }

    /// Whether the next signature finds its nonce ready, and so costs under a microsecond.
    var hasPresignature: Bool { ready.withLock { !$0.presignatures.isEmpty } }

    /// Whether the caller should run `presign` (on a thread that may block for a few tens of
    /// microseconds a nonce): half the nonces kept or fewer are ready, and no thread is making
    /// them. Waiting for half spares the making thread a wake-up for every signature.
    func claimPresigning() -> Bool {
        ready.withLock { ready in
            guard ready.presignatures.count <= Self.presignatureCapacity / 2, !ready.filling else { return false }
            ready.filling = true
            return true
        }
    }

    /// Makes nonces until `presignatureCapacity` are ready; called after `claimPresigning`.
    func presign() {
        defer { ready.withLock { $0.filling = false } }
        while ready.withLock({ $0.presignatures.count < Self.presignatureCapacity }) {
            var kinv: OpaquePointer?
            var r: OpaquePointer?
            let made = ECDSA_sign_setup(key, nil, &kinv, &r)
            Sodium.wipeStack(Self.stackWiped)
            guard made == 1, let kinv, let r else {
                BN_clear_free(kinv)
                BN_clear_free(r)
                return
            }
            let presignature = Presignature(kinv: kinv, r: r)
            ready.withLock { $0.presignatures.append(presignature) }
        }
    }

    /// Bytes of stack wiped after each multiplication by a secret scalar (the key, or a
    /// signature's nonce): more than OpenSSL's P-256 code uses, its point tables included.
    private static let stackWiped = 16 << 10

    /// `x` and `y` of `key`'s public point.
    private static func coordinates(_ key: OpaquePointer) -> [UInt8]? {
        var encoded = [UInt8](repeating: 0, count: 65)
        let length = encoded.withUnsafeMutableBufferPointer {
            EC_POINT_point2oct(
                EC_KEY_get0_group(key), EC_KEY_get0_public_key(key), POINT_CONVERSION_UNCOMPRESSED, $0.baseAddress, 65,
                nil)
        }
        guard length == 65, encoded[0] == 4 else { return nil }
        return Array(encoded[1...])
    }

    /// Whether libcrypto's secure heap is locked in RAM, or not started (no DPoP key yet).
    static var secureHeapLocked: Bool { CRYPTO_secure_malloc_initialized() == 0 || secureHeap == 1 }

    /// Starts OpenSSL's secure heap, once, before the first key: from then on libcrypto keeps
    /// private scalars and nonces there. 512 KiB holds the keys of thousands of accounts (64
    /// bytes each, and 64 a nonce). When the locked-memory limit refuses to lock it, it still
    /// serves, unlocked, and that is logged once.
    private static func secureHeapStarted() { _ = secureHeap }
    private static let secureHeap: Int32 = {
        let started = CRYPTO_secure_malloc_init(1 << 19, 32)
        if started != 1 {
            Logger(label: "brokerd").warning(
                """
                cannot lock DPoP keys in memory (OpenSSL's secure heap of 512 KiB, mlock refused); they stay usable \
                but may be swapped out; raise the locked-memory limit (RLIMIT_MEMLOCK, LimitMEMLOCK=)
                """)
        }
        return started
    }()
}

/// One signature's nonce made ahead (`ECDSA_sign_setup`): `k⁻¹` (in the secure heap) and
/// `r`. It is used once: it leaves the ready list before it signs, and is cleared when freed.
private final class Presignature: @unchecked Sendable {
    let kinv: OpaquePointer
    let r: OpaquePointer

    init(kinv: OpaquePointer, r: OpaquePointer) {
        self.kinv = kinv
        self.r = r
    }

    deinit {
        BN_clear_free(kinv)
        BN_clear_free(r)
    }
}
