import CSystemd

/// Talks to the service manager through libsystemd's `sd_notify`; every call is a no-op
/// when the daemon was not started by systemd (no `NOTIFY_SOCKET`).
public struct SystemdNotifier: Sendable {
    public init() {}

    /// Sends raw `KEY=value` lines; returns whether the manager received them.
    @discardableResult
    public func send(_ lines: String...) -> Bool {
        sd_notify(0, lines.joined(separator: "\n")) > 0
    }

    /// The broker can answer requests.
    @discardableResult
    public func ready(status: String) -> Bool { send("READY=1", "STATUS=\(status)") }

    /// A new one-line summary for `systemctl status`.
    @discardableResult
    public func status(_ text: String) -> Bool { send("STATUS=\(text)") }

    /// Shutdown has begun.
    @discardableResult
    public func stopping() -> Bool { send("STOPPING=1") }

    /// A reload has begun; `monotonicMicroseconds` is CLOCK_MONOTONIC now, as systemd requires.
    @discardableResult
    public func reloading(monotonicMicroseconds: UInt64) -> Bool {
        send("RELOADING=1", "MONOTONIC_USEC=\(monotonicMicroseconds)")
    }

    /// Pets the watchdog.
    @discardableResult
    public func watchdog() -> Bool { send("WATCHDOG=1") }

    /// The watchdog interval the manager expects, in microseconds, or `nil` when none is set.
    public func watchdogInterval() -> UInt64? {
        var microseconds: UInt64 = 0
        return sd_watchdog_enabled(0, &microseconds) > 0 ? microseconds : nil
    }

    /// The first socket passed by socket activation (`LISTEN_FDS`), or `nil` when there is none.
    public func inheritedSocket() -> Int32? {
        sd_listen_fds(1) >= 1 ? SD_LISTEN_FDS_START : nil
    }
}
