import BrokerProtocol
import COpenSSL
import FoundationEssentials
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
/// "Signing").
///
/// Unchecked `Sendable`: the `EC_KEY` is not changed after `init`, and libcrypto signs with one
/// key from several threads at once; the rest is behind a `Mutex`.
final class P256Signer: @unchecked Sendable {
    /// How many signatures' nonces are kept ready: enough for a burst of requests.
    static let presignatureCapacity = 16

    /// How a signature gets its nonce.
    enum SignatureNonce {
        /// One made ahead, or no signature (`sign` returns `nil`) when none is ready at once.
        case madeAhead
        /// One made ahead when ready, else made now.
        case anyReady
        /// Made now from the random source, the key and the message (libcrypto's hedged
        /// nonce): for the IdP's proofs, which are few and need no speed.
        case madeNow
    }

    private let key: OpaquePointer
    /// The public key's coordinates, 32 bytes of `x` then 32 of `y`.
    let publicKey: [UInt8]
    private let ready = Mutex(Ready())

    /// The nonces ready for the next signatures, and whether a thread is making more.
    private struct Ready: ~Copyable {
        var presignatures: [Presignature] = []
        var filling = false
    }

    /// A key with the private scalar `raw` (32 bytes, big-endian). Throws when it is not a P-256
    /// private key (zero, or not below the group's order), or when the secure heap is full.
    init(scalar raw: some ContiguousBytes) throws(BrokerFailure) {
        try Self.startSecureHeap()
        guard raw.withUnsafeBytes({ $0.count }) == 32 else { throw Self.notAKey }
        guard let key = EC_KEY_new_by_curve_name(NID_X9_62_prime256v1) else { throw Self.outOfMemory }
        var made = false
        defer { if !made { EC_KEY_free(key) } }
        guard let scalar = BN_secure_new() else { throw Self.outOfMemory }
        defer { BN_clear_free(scalar) }
        let group = EC_KEY_get0_group(key)
        guard let point = EC_POINT_new(group) else { throw Self.outOfMemory }
        defer { EC_POINT_free(point) }
        defer { Sodium.wipeStack(Self.stackWiped) }
        // A private key is a scalar from 1 to the group's order less one.
        guard raw.withUnsafeBytes({ BN_bin2bn($0.baseAddress, 32, scalar) }) != nil else { throw Self.outOfMemory }
        guard BN_is_zero(scalar) == 0, BN_cmp(scalar, EC_GROUP_get0_order(group)) < 0 else { throw Self.notAKey }
        // Its public key is derived once, here (`EC_KEY_check_key` would derive it again).
        guard EC_KEY_set_private_key(key, scalar) == 1, EC_POINT_mul(group, point, scalar, nil, nil, nil) == 1,
            EC_KEY_set_public_key(key, point) == 1, let publicKey = Self.coordinates(key)
        else { throw Self.outOfMemory }
        self.key = key
        self.publicKey = publicKey
        made = true
    }

    /// A new key from OpenSSL's random source, with its private scalar written to `scalar` (32
    /// bytes) for the vault.
    static func generate(scalar: inout [UInt8]) throws(BrokerFailure) -> P256Signer {
        try startSecureHeap()
        guard scalar.count == 32 else { throw notAKey }
        guard let key = EC_KEY_new_by_curve_name(NID_X9_62_prime256v1) else { throw outOfMemory }
        defer {
            EC_KEY_free(key)
            Sodium.wipeStack(stackWiped)
        }
        guard EC_KEY_generate_key(key) == 1, let made = EC_KEY_get0_private_key(key),
            BN_bn2binpad(made, &scalar, 32) == 32
        else { throw outOfMemory }
        return try P256Signer(scalar: scalar)
    }

    deinit { EC_KEY_free(key) }

    /// The ES256 signature of `message` (RFC 7518 section 3.4: `r` then `s`, 32 bytes each), its
    /// nonce taken as `nonce` says; `nil` when libcrypto fails, or no nonce made ahead is ready
    /// at once for `.madeAhead` (the ready list is not waited for: the thread that makes nonces
    /// may hold it).
    func sign(_ message: [UInt8], nonce: SignatureNonce) -> [UInt8]? {
        let presignature: Presignature?
        switch nonce {
        case .madeAhead:
            guard let taken = ready.withLockIfAvailable({ $0.presignatures.popLast() }), let taken else { return nil }
            presignature = taken
        case .anyReady: presignature = ready.withLock { $0.presignatures.popLast() }
        case .madeNow: presignature = nil
        }
        let digest = Sodium.sha256(message)
        let signature = digest.withUnsafeBufferPointer { digest in
            guard let presignature else {
                defer { Sodium.wipeStack(Self.stackWiped) }
                return ECDSA_do_sign(digest.baseAddress, 32, key)
            }
            return withExtendedLifetime(presignature) {
                ECDSA_do_sign_ex(digest.baseAddress, 32, presignature.kinv, presignature.r, key)
            }
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

    /// How many nonces the caller should make with `presign(_:)` on a thread that may block (a
    /// few tens of microseconds each); 0 when more than half of those kept are ready, a thread
    /// is making them, or the ready list is held (called on an event loop, this never waits: a
    /// later proof claims). Waiting for half spares that thread a wake-up for every signature.
    func claimPresigning() -> Int {
        let claimed = ready.withLockIfAvailable { ready in
            let wanted = Self.presignatureCapacity - ready.presignatures.count
            guard wanted >= Self.presignatureCapacity / 2, !ready.filling else { return 0 }
            ready.filling = true
            return wanted
        }
        return claimed ?? 0
    }

    /// Makes `count` nonces, the number `claimPresigning()` gave, outside the ready list's lock,
    /// and adds them to it at once. Makes fewer when the secure heap is more than half used: the
    /// other half stays for keys.
    func presign(_ count: Int) {
        var made: [Presignature] = []
        defer {
            ready.withLock { ready in
                ready.presignatures += made
                ready.filling = false
            }
        }
        while made.count < count, CRYPTO_secure_used() < Self.secureHeapSize / 2 {
            var kinv: OpaquePointer?
            var r: OpaquePointer?
            let setUp = ECDSA_sign_setup(key, nil, &kinv, &r)
            Sodium.wipeStack(Self.stackWiped)
            guard setUp == 1, let kinv, let r else {
                BN_clear_free(kinv)
                BN_clear_free(r)
                return
            }
            made.append(Presignature(kinv: kinv, r: r))
        }
    }

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

    private static let notAKey = BrokerFailure.invalid("the vault holds a DPoP key that is not a P-256 private key")
    private static let outOfMemory = BrokerFailure.outOfGuardedMemory

    /// Bytes of stack wiped after each multiplication by a secret scalar (the key, or a
    /// signature's nonce): more than OpenSSL's P-256 code uses, its point tables included.
    private static let stackWiped = 16 << 10

    /// The secure heap's size: the keys of about 8,000 accounts (64 bytes each) in one half, and
    /// nonces made ahead (64 bytes each) in the other.
    private static let secureHeapSize = 1 << 20

    /// What `CRYPTO_secure_malloc_init` answered (1: locked; 2: not locked; 0: no secure heap),
    /// `nil` before the first key.
    private static let secureHeap = Mutex<Int32?>(nil)

    /// Whether libcrypto's secure heap is locked in RAM, or not started (no DPoP key yet).
    static var secureHeapLocked: Bool { secureHeap.withLock { $0 == nil || $0 == 1 } }

    /// Starts OpenSSL's secure heap, once, before the first key: from then on libcrypto keeps
    /// private scalars and nonces there. When the locked-memory limit refuses to lock it, it
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
