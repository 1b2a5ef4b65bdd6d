import BrokerProtocol
import FoundationEssentials
import ServiceLifecycle
import Synchronization

/// The loop that starts due refreshes, run as a `Service`. It records a heartbeat on every
/// pass so the systemd watchdog can tell a live scheduler from a wedged one.
public final class RefreshScheduler: Service {
    /// Longest sleep between passes, so new schedules and clock jumps are noticed promptly.
    static let maximumSleep: Duration = .milliseconds(250)

    private let broker: Broker
    private let heartbeat = Mutex<ContinuousClock.Instant>(.now)
    /// Test-only fault switch: when this file appears, the loop deletes it and wedges for good,
    /// so tests can see the systemd watchdog kill and restart a stuck broker.
    private let wedgeFile: String?

    public init(broker: Broker, wedgeFile: String? = nil) {
        self.broker = broker
        self.wedgeFile = wedgeFile
    }

    /// When the loop last completed a pass.
    public var lastHeartbeat: ContinuousClock.Instant { heartbeat.withLock { $0 } }

    public func run() async throws {
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            if let wedgeFile, (try? FileManager.default.removeItem(atPath: wedgeFile)) != nil {
                try? await gracefulShutdown()
                return
            }
            let next = await broker.runDueRefreshes()
            heartbeat.withLock { $0 = .now }
            var pause = Self.maximumSleep
            if let next {
                let seconds = max(0.01, next.timeIntervalSinceNow)
                pause = min(pause, .milliseconds(Bounds.milliseconds(seconds)))
            }
            try? await cancelWhenGracefulShutdown { [pause] in try await Task.sleep(for: pause) }
        }
    }
}
