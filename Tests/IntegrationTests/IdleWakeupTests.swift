import FoundationEssentials
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// An idle brokerd sleeps until its next deadline (docs/performance.md, "An idle brokerd
/// sleeps"): its threads are not switched in between, which is counted from
/// /proc/PID/task/*/status. A scheduler that polled every 250 ms and a status loop that looked
/// every second woke it about 30 times a second; libdispatch's workqueue monitor, once a second.
@Suite struct IdleWakeupTests {
    /// Seconds a started broker is left to settle before counting (its idle memory is
    /// released one second after start, and the account's add is answered and saved).
    static let settle = Duration.seconds(3)
    /// Seconds counted.
    static let window = Duration.seconds(10)

    @Test func anIdleBrokerWithOneAccountValidForAnHourDoesNotWake() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        try addStatic(to: broker, expiresIn: 3600)
        let woke = try await wakeUps(of: broker).switches
        // At most 3 in 10 s: libdispatch's workqueue monitor (started by the first task run on
        // its threads) woke brokerd about 10 times in these 10 s, the old 250 ms poll about 220.
        #expect(woke <= 3, "context switches over \(Self.window) idle: \(woke)")
    }

    @Test func withAWatchdogOnlyItsPingsWakeIt() async throws {
        let broker = try BrokerProcess()
        let notify = try DatagramListener(path: broker.root.appendingPathComponent("notify.sock").path)
        // A ping every 3 s. The notify socket queues at most 10 datagrams unread, and brokerd's
        // notifier sends one ping for all that wait while it is full, so the socket is read
        // after settling and before stopping: then each ping in the window is a datagram.
        try await broker.start(environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "6000000"])
        defer { broker.stop() }
        try addStatic(to: broker, expiresIn: 3600)
        let (woke, lasted) = try await wakeUps(of: broker) { while notify.receiveQueued() != nil {} }
        var pings = 0
        while let datagram = notify.receiveQueued() {
            if datagram == "WATCHDOG=1" { pings += 1 }
        }
        // One ping every 3 s of the time counted (a loaded machine may sleep past the window).
        let counted = lasted / .seconds(1)
        #expect(abs(Double(pings) - counted / 3) <= 1.5, "pings in \(counted) s: \(pings)")
        // 3 in the window as in the test above, and 3 for each ping (its timer on the event
        // loop, the task that queues it, the notifier's thread that sends it, which otherwise
        // sleeps); libdispatch's monitor alone would add one a second.
        #expect(woke <= 3 + 3 * pings, "context switches over \(counted) s with \(pings) pings: \(woke)")
    }

    @Test func theStatusFollowsATokensExpiryWithoutPolling() async throws {
        let broker = try BrokerProcess()
        let notify = try DatagramListener(path: broker.root.appendingPathComponent("notify.sock").path)
        try await broker.start(environment: ["NOTIFY_SOCKET": notify.path])
        defer { broker.stop() }
        let added = ContinuousClock.now
        try addStatic(to: broker, expiresIn: 2)
        var statuses: [String] = []
        while let message = notify.receive(timeout: 5) {
            statuses.append(message)
            if message == "STATUS=1 account: 1 needs login" { break }
        }
        #expect(statuses.last == "STATUS=1 account: 1 needs login", "\(statuses)")
        #expect(statuses.contains("STATUS=1 account: 1 valid"), "\(statuses)")
        #expect(added.duration(to: .now) < .seconds(3.5), "the status changed at the expiry, not later")
    }

    /// Adds a static account whose token expires in `seconds`, and waits for the answer (up to
    /// 60 s: the rest of the suite may hold the machine), so that its work is over before counting.
    private func addStatic(to broker: BrokerProcess, expiresIn seconds: Int) throws {
        let answer = try RawConnection(path: broker.socketPath, readTimeout: 60).request(
            #"{"id":1,"op":"add","account":"idle","provider":{"kind":"static"},"tokens":{"access_token":"at-idle","expires_in":\#(seconds)}}"#
        )
        try #require(answer?.contains(#""ok":true"#) == true, "\(answer ?? "no answer")")
    }

    /// The context switches of all of brokerd's threads over `window` (and how long that
    /// lasted: a loaded machine may sleep past it), after `settle` and then `settled`.
    private func wakeUps(of broker: BrokerProcess, settled: () -> Void = {}) async throws -> (
        switches: Int, lasted: Duration
    ) {
        let process = try #require(broker.process)
        // brokerd settles after its start, then idles for the window counted.
        try await Task.sleep(for: Self.settle)
        settled()
        let before = process.contextSwitches()
        let started = ContinuousClock.now
        try await Task.sleep(for: Self.window)
        return (process.contextSwitches().since(before), started.duration(to: .now))
    }
}
