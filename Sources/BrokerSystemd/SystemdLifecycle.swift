import ServiceLifecycle

/// Keeps the service manager informed while the broker runs, as a `Service`: refreshes
/// `STATUS=` when the summary changes, pets the watchdog at half its interval only while
/// `isHealthy` says the broker's own loop is alive, and sends `STOPPING=1` on shutdown.
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
        let watchdog = notifier.watchdogInterval()
        let period = min(Duration.seconds(2), watchdog.map { Duration.microseconds(Int64($0 / 2)) } ?? .seconds(2))
        await withGracefulShutdownHandler {
            var lastStatus = ""
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                let status = await summary()
                if status != lastStatus {
                    notifier.status(status)
                    lastStatus = status
                }
                if watchdog != nil, isHealthy() { notifier.watchdog() }
                try? await cancelWhenGracefulShutdown { try await Task.sleep(for: period) }
            }
        } onGracefulShutdown: {
            notifier.stopping()
        }
    }
}
