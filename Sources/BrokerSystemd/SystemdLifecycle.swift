import ServiceLifecycle

/// Keeps the service manager informed while the broker runs, as a `Service`: refreshes
/// `STATUS=` within a second of the summary changing, pets the watchdog at half its interval
/// only while `isHealthy` says the broker's own loop is alive (so a wedged broker is killed
/// and restarted), and sends `STOPPING=1` on shutdown.
public struct SystemdLifecycle: Service {
    private let notifier: SystemdNotifier
    private let summary: @Sendable () async -> String
    private let isHealthy: @Sendable () -> Bool

    public init(
        notifier: SystemdNotifier = SystemdNotifier(), summary: @escaping @Sendable () async -> String,
        isHealthy: @escaping @Sendable () -> Bool
    ) {
        self.notifier = notifier
        self.summary = summary
        self.isHealthy = isHealthy
    }

    public func run() async throws {
        let petEvery = notifier.watchdogInterval().map { Duration.microseconds(Int64($0 / 2)) }
        let period = min(Duration.seconds(1), petEvery ?? .seconds(1))
        await withGracefulShutdownHandler {
            var lastStatus = ""
            var lastPet = ContinuousClock.now
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                let status = await summary()
                if status != lastStatus {
                    notifier.status(status)
                    lastStatus = status
                }
                if let petEvery, lastPet.duration(to: .now) >= petEvery - .milliseconds(50), isHealthy() {
                    notifier.watchdog()
                    lastPet = .now
                }
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: period) }
            }
        } onGracefulShutdown: {
            notifier.stopping()
        }
    }
}
