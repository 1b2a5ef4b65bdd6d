import BrokerModel
import BrokerSecrets
import COpenSSL
import NIOCore
import Synchronization

/// One key's libcrypto contexts ready to sign (`EVP_PKEY_sign_init` done), reused from one
/// signature to the next, since making one per signature cost more than the signature's
/// arithmetic. Each is used by one thread at a time; as many wait here as signatures are made
/// at once by the signing threads (one per core), and one made beyond those is freed after use.
package final class SignContexts: Sendable {
    /// An `EVP_PKEY_CTX` held by one thread at a time: unchecked `Sendable`, as it only passes
    /// from one signature to the next through the lock.
    package struct Context: @unchecked Sendable {
        package let pointer: OpaquePointer

        package func free() { EVP_PKEY_CTX_free(pointer) }
    }

    /// The contexts kept at most.
    private static let kept = System.coreCount

    private let idle = Mutex<[Context]>([])

    /// A context ready to sign with `key` (a kept one, else a new one); `nil` when libcrypto fails.
    package func take(for key: OpaquePointer) -> Context? {
        if let context = idle.withLock({ $0.popLast() }) { return context }
        guard let pointer = EVP_PKEY_CTX_new_from_pkey(nil, key, nil) else { return nil }
        guard EVP_PKEY_sign_init(pointer) == 1 else {
            EVP_PKEY_CTX_free(pointer)
            return nil
        }
        return Context(pointer: pointer)
    }

    /// Gives back a context after a signature that succeeded: kept for the next one, or freed.
    package func putBack(_ context: Context) {
        let kept = idle.withLock { idle in
            guard idle.count < Self.kept else { return false }
            idle.append(context)
            return true
        }
        if !kept { context.free() }
    }

    deinit { idle.withLock { $0.forEach { $0.free() } } }
}
