import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Synchronization

/// A flag that any thread raises and one task waits for: how a sleeping loop (the refresh
/// scheduler, the service manager's status) learns that something changed, instead of looking
/// every so often. A raise while nobody waits is kept until the next wait.
public final class WakeSignal: Sendable {
    private struct State {
        var raised = false
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state = Mutex(State())

    public init() {}

    /// Wakes the waiter, or the next wait if nobody waits now.
    public func raise() {
        let waiter = state.withLock { state in
            guard let waiter = state.waiter else {
                state.raised = true
                return nil as CheckedContinuation<Void, Never>?
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume()
    }

    /// Forgets a raise nobody waited for yet (it asked for what the caller has just done).
    public func clear() {
        state.withLock { $0.raised = false }
    }

    /// Returns once the signal is raised (at once if it was raised since the last wait), or
    /// when the task is cancelled. One waiter at a time.
    public func wait() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (waiter: CheckedContinuation<Void, Never>) in
                let now = state.withLock { state in
                    precondition(state.waiter == nil, "one waiter at a time")
                    guard !state.raised, !Task.isCancelled else {
                        state.raised = false
                        return true
                    }
                    state.waiter = waiter
                    return false
                }
                if now { waiter.resume() }
            }
        } onCancel: {
            raise()
        }
    }
}
