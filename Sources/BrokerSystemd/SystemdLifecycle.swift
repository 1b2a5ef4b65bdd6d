import ServiceLifecycle

/// Keeps the service manager informed while the broker runs, as a `Service`: sends a new
/// `STATUS=` when the summary changes (looked at when `changed` returns, and at each watchdog
/// ping), pets the watchdog at half its interval only while `isHealthy` says the broker's own
/// loop is alive (so a wedged broker is killed and restarted), and sends `STOPPING=1` on
/// shutdown. Between those it sleeps: without a watchdog, an idle broker never wakes it.
public struct SystemdLifecycle: Service {
    private let notifier: SystemdNotifier
    private let summary: @Sendable () async -> String
    private let changed: (@Sendable () async -> Void)?
    private let isHealthy: @Sendable () -> Bool
    private let sleepUntil: @Sendable (ContinuousClock.Instant) async throws -> Void

    /// `changed` returns when the summary may have changed since it last returned (and when
    /// its task is cancelled); without it, the summary is looked at only at watchdog pings.
    /// `sleep` waits for a watchdog ping's time (brokerd's waits on its event loops rather than
    /// through `Task.sleep`; docs/performance.md says why).
    public init(
        notifier: SystemdNotifier = SystemdNotifier(), summary: @escaping @Sendable () async -> String,
        changed: (@Sendable () async -> Void)? = nil, isHealthy: @escaping @Sendable () -> Bool,
        sleep: @escaping @Sendable (ContinuousClock.Instant) async throws -> Void = {
            try await Task.sleep(until: $0, clock: .continuous)
        }
    ) {
        self.notifier = notifier
        self.summary = summary
        self.changed = changed
        self.isHealthy = isHealthy
        self.sleepUntil = sleep
    }

    public func run() async throws {
        let petEvery = notifier.watchdogInterval().map { Duration.microseconds(Int64($0 / 2)) }
        await withGracefulShutdownHandler {
            var lastStatus = ""
            var nextPet = ContinuousClock.now
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                let status = await summary()
                if status != lastStatus {
                    notifier.status(status)
                    lastStatus = status
                }
                if let petEvery, ContinuousClock.now >= nextPet - .milliseconds(50) {
                    if isHealthy() { notifier.watchdog() }
                    nextPet = .now + petEvery
                }
                await sleep(until: petEvery == nil ? nil : nextPet)
            }
        } onGracefulShutdown: {
            notifier.stopping()
        }
    }

    /// Returns at the next change, at `deadline` if there is one, or at shutdown.
    private func sleep(until deadline: ContinuousClock.Instant?) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await gracefulShutdown() }
            if let changed { group.addTask { await changed() } }
            if let deadline { group.addTask { [sleepUntil] in try? await sleepUntil(deadline) } }
            await group.next()
            group.cancelAll()
        }
    }
}
