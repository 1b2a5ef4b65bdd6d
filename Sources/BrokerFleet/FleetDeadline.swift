import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Synchronization

/// Gives up on a call to the fleet's database after a deadline. postgres-nio keeps a query
/// waiting for a connection while none can be made, and does not always end it when its task is
/// cancelled; so the call is left to finish on its own, and its caller gets an error at the
/// deadline. What a late call does is safe to leave: a commit that lands late is found by its
/// version, a lease taken late lapses.
enum FleetDeadline {
    /// The caller's continuation, resumed once: by the call's end or by the deadline.
    private final class Waiter<T: Sendable>: Sendable {
        let continuation: Mutex<CheckedContinuation<T, any Error>?>
        init(_ continuation: CheckedContinuation<T, any Error>) { self.continuation = Mutex(continuation) }
        func resume(with result: Result<T, any Error>) {
            continuation.withLock { $0.take() }?.resume(with: result)
        }
    }

    static func run<T: Sendable>(
        within deadline: Duration, _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            let waiter = Waiter(continuation)
            let timer = Task {
                guard (try? await EventLoopSleep.sleep(for: deadline)) != nil else { return }
                let seconds = deadline.components.seconds
                waiter.resume(with: .failure(FleetError("the fleet's database did not answer within \(seconds) s")))
            }
            Task {
                let result: Result<T, any Error>
                do {
                    result = .success(try await body())
                } catch {
                    result = .failure(error)
                }
                timer.cancel()
                waiter.resume(with: result)
            }
        }
    }
}
