import Foundation

/// Runs `body` on a thread of its own and returns what it returns: a blocking wait (a child
/// process, a socket read, a key derivation) there does not hold one of the few threads that
/// every test's tasks share, which would stall unrelated tests running alongside.
public func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}
