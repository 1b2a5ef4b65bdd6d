import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import ServiceLifecycle
import Synchronization

/// Starts due refreshes, run as a `Service`. It sleeps until the next deadline (a refresh, the
/// end of a backoff, a source to look at, a token's expiry) on a wall-clock timer that also
/// wakes it when the wall clock is set or the machine resumes (`WallClockTimer`), and is woken
/// early by any change to the accounts (`Broker.changes`), so an idle broker does not wake.
public final class RefreshScheduler: Service {
    private let broker: Broker
    /// When the pass under way began; `nil` between passes.
    private let passBegan = Mutex<ContinuousClock.Instant?>(nil)

    public init(broker: Broker) {
        self.broker = broker
    }

    /// Whether no pass has been under way for `limit` or longer: a longer one means the engine
    /// is wedged, and the systemd watchdog should no longer be petted.
    public func isResponsive(within limit: Duration) -> Bool {
        passBegan.withLock { began in began.map { $0.duration(to: .now) < limit } ?? true }
    }

    public func run() async throws {
        let wake = WakeSignal()
        let timer = try WallClockTimer(fired: wake.raise)
        broker.changes.subscribe(wake)
        // Shutdown cancels the loop; a cancelled wait returns at once, however late it begins.
        await cancelWhenGracefulShutdown { [self] in
            while !Task.isCancelled {
                passBegan.withLock { $0 = .now }
                let next = await broker.schedulingPass(clearing: wake)
                passBegan.withLock { $0 = nil }
                timer.set(to: next)
                await wake.wait()
            }
        }
        broker.changes.unsubscribe(wake)
        await timer.close()
    }
}

extension Broker {
    /// One pass of the scheduler: starts the refreshes that are due and returns the next
    /// deadline, which includes the next token expiry (an account's state changes then, so the
    /// service manager's status is told). The pass's own changes do not wake the scheduler again.
    fileprivate func schedulingPass(clearing wake: WakeSignal) -> Date? {
        // Counting the states at `now` leaves the expiries still to come.
        _ = accounts.stateCounts(now: clock.now())
        let next = [runDueRefreshes(), accounts.nextStateChange].compactMap { $0 }.min()
        changes.announce()
        wake.clear()
        return next
    }
}
