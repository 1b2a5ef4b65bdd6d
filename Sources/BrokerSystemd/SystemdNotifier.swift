import CSystemd
import Dispatch
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Talks to the service manager through libsystemd's `sd_notify`, from a thread of its own:
/// `sendmsg` on the notification socket blocks while the manager does not read it (a
/// daemon-reload, a boot), and neither an event loop nor the cooperative pool may wait for
/// that. Callers only queue: messages go out in order, then the status, then a ping; `STATUS=`
/// is coalesced to the latest text, at most about once a second; a watchdog ping already
/// waiting is not queued twice. The thread sleeps until there is something to send, so an idle
/// broker does not wake it. Every call is a no-op when the daemon was not started by systemd
/// (no `NOTIFY_SOCKET`).
public final class SystemdNotifier: Sendable {
    /// The shortest time between two `STATUS=` datagrams.
    static let statusInterval = Duration.seconds(1)

    private let outbox: Outbox?

    public init() {
        outbox = getenv("NOTIFY_SOCKET") == nil ? nil : Outbox()
    }

    /// Ends the thread; what was not flushed is dropped, so nothing is sent after the notifier
    /// is gone (`sd_notify` reads `NOTIFY_SOCKET` again for each datagram).
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

    /// How the sender waits on `wake`: each sleep is ended by at most one signal, so a burst of
    /// calls costs it one wake-up, not one each.
    private enum Sleep {
        case awake
        case untilWoken
        /// Until the coalesced `STATUS=` is due; a newer status does not wake it earlier.
        case untilStatusDue(ContinuousClock.Instant)
    }

    private struct State {
        var messages: [String] = []
        var status: String?
        var watchdog = false
        var lastStatus: ContinuousClock.Instant?
        /// Datagrams taken by the sender and not yet handed to the manager.
        var sending = false
        var sleep = Sleep.awake
        /// A `flush` waits on `drained`.
        var flushing = false
        var closed = false

        var isEmpty: Bool { messages.isEmpty && status == nil && !watchdog && !sending }

        /// When the waiting `STATUS=` may go (`now` when it may go at once: while a flush
        /// waits, it does not wait for its second).
        func statusDue(at now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
            guard status != nil else { return nil }
            guard !flushing, let lastStatus else { return now }
            return lastStatus + SystemdNotifier.statusInterval
        }

        /// Whether the sender must be signalled; it is then counted as awake.
        mutating func wakeSender(forStatusOnly: Bool = false) -> Bool {
            switch sleep {
            case .awake: return false
            case .untilStatusDue where forStatusOnly: return false
            case .untilWoken, .untilStatusDue:
                sleep = .awake
                return true
            }
        }

        /// The datagrams to send now, in order; `nil` once closed.
        mutating func take(at now: ContinuousClock.Instant) -> [String]? {
            guard !closed else { return nil }
            var datagrams = messages
            messages = []
            if let status, let due = statusDue(at: now), due <= now {
                datagrams.append("STATUS=\(status)")
                self.status = nil
                lastStatus = now
            }
            if watchdog { datagrams.append("WATCHDOG=1") }
            watchdog = false
            sending = !datagrams.isEmpty
            return datagrams
        }
    }

    /// Messages other than `STATUS=` and pings kept at most (a few per reload in practice).
    static let messageLimit = 256

    private let state = Mutex(State())
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
        let signal = state.withLock { state in
            switch item {
            case .message(let text):
                // A manager that never reads (or a thread that could not start) costs a bounded queue.
                if state.messages.count >= Self.messageLimit { state.messages.removeFirst() }
                state.messages.append(text)
            case .status(let text):
                state.status = text
                return state.wakeSender(forStatusOnly: true)
            case .watchdog: state.watchdog = true
            }
            return state.wakeSender()
        }
        if signal { wake.signal() }
    }

    func close() {
        let signal = state.withLock { state in
            state.closed = true
            return state.wakeSender()
        }
        if signal { wake.signal() }
    }

    func flush(timeout: Duration) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while true {
            let (done, signal) = state.withLock { state in
                if state.isEmpty { return (true, false) }
                state.flushing = true
                return (false, state.wakeSender())
            }
            if done { return true }
            if signal { wake.signal() }
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else {
                state.withLock { $0.flushing = false }
                return false
            }
            _ = drained.wait(timeout: .now() + left.dispatchInterval)
        }
    }

    /// Sends what is queued, in order, then sleeps until more is queued or the waiting
    /// `STATUS=` is due; returns once closed, dropping the rest.
    private func run() {
        while let datagrams = state.withLock({ $0.take(at: .now) }) {
            for datagram in datagrams {
                guard !state.withLock({ $0.closed }) else { return }
                sd_notify(0, datagram)
            }
            let (sleep, drainedNow) = state.withLock { state in
                let now = ContinuousClock.now
                state.sending = false
                let drainedNow = state.flushing && state.isEmpty
                if drainedNow { state.flushing = false }
                if state.closed || !state.messages.isEmpty || state.watchdog {
                    state.sleep = .awake
                } else if let due = state.statusDue(at: now), due > now {
                    state.sleep = .untilStatusDue(due)
                } else if state.status != nil {
                    state.sleep = .awake
                } else {
                    state.sleep = .untilWoken
                }
                return (state.sleep, drainedNow)
            }
            if drainedNow { drained.signal() }
            switch sleep {
            case .awake: continue
            case .untilWoken: wake.wait()
            case .untilStatusDue(let due):
                if wake.wait(timeout: .now() + ContinuousClock.now.duration(to: due).dispatchInterval) == .timedOut {
                    // A signal sent as this timed out is left in `wake` and ends the next sleep early, once.
                    state.withLock { $0.sleep = .awake }
                }
            }
        }
    }
}

extension Duration {
    /// The same span for Dispatch, at least 0.
    fileprivate var dispatchInterval: DispatchTimeInterval {
        .nanoseconds(Int(max(0, components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000)))
    }
}
