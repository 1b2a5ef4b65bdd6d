import ServiceLifecycle
import UnixSignals

#if canImport(Glibc)
import Glibc
#endif

/// Reloads on SIGHUP, as a `Service`, telling systemd `RELOADING=1` (with `MONOTONIC_USEC`)
/// before and `READY=1` after, as `Type=notify` services must.
public struct ReloadOnHangup: Service {
    private let notifier: SystemdNotifier
    private let reload: @Sendable () async -> Void

    public init(notifier: SystemdNotifier = SystemdNotifier(), reload: @escaping @Sendable () async -> Void) {
        self.notifier = notifier
        self.reload = reload
    }

    public func run() async throws {
        for await _ in await UnixSignalsSequence(trapping: .sighup).cancelOnGracefulShutdown() {
            notifier.reloading(monotonicMicroseconds: Self.monotonicMicroseconds())
            await reload()
            notifier.send("READY=1")
        }
    }

    static func monotonicMicroseconds() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
    }
}
