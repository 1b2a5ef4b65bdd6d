import CSystemd
import Dispatch
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Talks to the service manager through libsystemd's `sd_notify`, from a thread of its own:
/// `sendmsg` on the notification socket blocks while the manager does not read it (a
/// daemon-reload, a boot), and neither an event loop nor the cooperative pool may wait for
/// that. Callers only queue: messages go out in order, then the status, then a ping; `STATUS=` is coalesced to the latest
/// text, at most about once a second; a watchdog ping already waiting is not queued twice.
/// Every call is a no-op when the daemon was not started by systemd (no `NOTIFY_SOCKET`).
public final class SystemdNotifier: Sendable {
    /// The shortest time between two `STATUS=` datagrams.
    static let statusInterval = Duration.seconds(1)

    private let outbox: Outbox?

    public init() {
        outbox = getenv("NOTIFY_SOCKET") == nil ? nil : Outbox()
    }

    deinit { outbox?.close() }

    /// Whether there is a service manager to tell (`NOTIFY_SOCKET` was set).
    public var isEnabled: Bool { outbox != nil }

    /// Queues raw `KEY=value` lines, sent as one datagram.
    public func send(_ lines: String...) { outbox?.queue(.message(lines.joined(separator: "\n"))) }

    /// The broker can answer requests.
    public func ready(status: String) { send("READY=1", "STATUS=\(status)") }

    /// A new one-line summary for `systemctl status`; only the latest one waiting is sent.
    public func status(_ text: String) { outbox?.queue(.status(text)) }

    /// Shutdown has begun.
    public func stopping() { send("STOPPING=1") }

    /// A reload has begun; `monotonicMicroseconds` is CLOCK_MONOTONIC now, as systemd requires.
    public func reloading(monotonicMicroseconds: UInt64) {
        send("RELOADING=1", "MONOTONIC_USEC=\(monotonicMicroseconds)")
    }

    /// Pets the watchdog.
    public func watchdog() { outbox?.queue(.watchdog) }

    /// Waits until everything queued was handed to the manager, or `timeout` has passed (a
    /// manager that does not read must not keep the broker from exiting); whether it was.
    /// Blocks: call it off the event loops and the cooperative pool, or as the process ends.
    @discardableResult
    public func flush(timeout: Duration) -> Bool { outbox?.flush(timeout: timeout) ?? true }

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

/// What waits to be sent, and the thread that sends it.
private final class Outbox: Sendable {
    enum Item {
        case message(String)
        case status(String)
        case watchdog
    }

    private struct Pending {
        var messages: [String] = []
        var status: String?
        var watchdog = false
        var lastStatus: ContinuousClock.Instant?
        /// Items taken by the sender and not yet handed to the manager.
        var sending = 0
        var closed = false

        var isEmpty: Bool { messages.isEmpty && status == nil && !watchdog && sending == 0 }
    }

    /// Messages other than `STATUS=` and pings kept at most (a few per reload in practice).
    static let messageLimit = 256

    private let pending = Mutex(Pending())
    private let wake = DispatchSemaphore(value: 0)
    private let drained = DispatchSemaphore(value: 0)

    init() {
        // A detached POSIX thread (no Foundation here), which keeps the outbox until `close`.
        let body = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let started = pthread_create(
            &thread, nil,
            { raw in
                Unmanaged<Outbox>.fromOpaque(raw!).takeRetainedValue().run()
                return nil
            }, body)
        if started == 0 {
            pthread_detach(thread)
        } else {
            Unmanaged<Outbox>.fromOpaque(body).release()
        }
    }

    func queue(_ item: Item) {
        pending.withLock { pending in
            switch item {
            case .message(let text):
                // A manager that never reads (or a thread that could not start) costs a bounded queue.
                if pending.messages.count >= Self.messageLimit { pending.messages.removeFirst() }
                pending.messages.append(text)
            case .status(let text): pending.status = text
            case .watchdog: pending.watchdog = true
            }
        }
        wake.signal()
    }

    func close() {
        pending.withLock { $0.closed = true }
        wake.signal()
    }

    func flush(timeout: Duration) -> Bool {
        let deadline = ContinuousClock.now + timeout
        // A coalesced STATUS= waiting for its second goes now.
        pending.withLock { $0.lastStatus = nil }
        while !pending.withLock({ $0.isEmpty }) {
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { return false }
            wake.signal()
            _ = drained.wait(timeout: .now() + .milliseconds(Int(min(left, .milliseconds(50)).milliseconds)))
        }
        return true
    }

    /// Sends what is queued, in order, then waits for more (or for the next `STATUS=` to be due).
    private func run() {
        while true {
            let now = ContinuousClock.now
            let (messages, watchdog, status, statusDue, closed) = pending.withLock { pending in
                let due = pending.lastStatus.map { $0 + SystemdNotifier.statusInterval } ?? now
                let status = due <= now ? pending.status : nil
                if status != nil {
                    pending.status = nil
                    pending.lastStatus = now
                }
                let taken = (
                    pending.messages, pending.watchdog, status, pending.status == nil ? nil : due, pending.closed
                )
                pending.sending = taken.0.count + (taken.1 ? 1 : 0) + (status == nil ? 0 : 1)
                pending.messages = []
                pending.watchdog = false
                return taken
            }
            for message in messages { sd_notify(0, message) }
            if let status { sd_notify(0, "STATUS=\(status)") }
            if watchdog { sd_notify(0, "WATCHDOG=1") }
            pending.withLock { $0.sending = 0 }
            drained.signal()
            if closed, statusDue == nil, messages.isEmpty { return }
            if let statusDue {
                _ = wake.wait(
                    timeout: .now() + .milliseconds(Int(ContinuousClock.now.duration(to: statusDue).milliseconds)))
            } else {
                wake.wait()
            }
        }
    }
}

extension Duration {
    /// Whole milliseconds, at least 0.
    fileprivate var milliseconds: Int64 {
        max(0, components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000)
    }
}
