import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Synchronization

/// Tells every listener that the broker's accounts changed (an account added or removed, new
/// tokens, a refresh's outcome, a reload, a lock or unlock), so that the refresh scheduler and
/// the service manager's status sleep until then instead of polling.
public final class ChangeBroadcast: Sendable {
    private let listeners = Mutex<[WakeSignal]>([])

    public init() {}

    /// Raises `signal` at every change from now on, until `unsubscribe`.
    public func subscribe(_ signal: WakeSignal) {
        listeners.withLock { $0.append(signal) }
    }

    public func unsubscribe(_ signal: WakeSignal) {
        listeners.withLock { $0.removeAll { $0 === signal } }
    }

    /// Raises every listener's signal.
    public func announce() {
        for listener in listeners.withLock({ $0 }) { listener.raise() }
    }
}
