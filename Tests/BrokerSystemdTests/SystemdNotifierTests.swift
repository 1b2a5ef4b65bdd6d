import FoundationEssentials
import Logging
import ServiceLifecycle
import Synchronization
import Testing
import TestSupport

@testable import BrokerSystemd

#if canImport(Glibc)
import Glibc
#endif

/// A service manager's notification socket: an AF_UNIX datagram socket bound in a temp dir.
final class NotifySocket {
    let path: String
    private let directory: String
    private let descriptor: Int32

    init() throws {
        // sun_path holds 108 bytes, so keep the path short.
        directory = "/tmp/tbsd-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        path = directory + "/notify"
        descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        guard descriptor >= 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard result == 0 else {
            close(descriptor)
            throw POSIXError(.init(rawValue: errno) ?? .EIO)
        }
    }

    deinit {
        close(descriptor)
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The next datagram if one is queued, without waiting.
    func poll() -> String? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = recv(descriptor, &buffer, buffer.count, Int32(MSG_DONTWAIT))
        guard count >= 0 else { return nil }
        return String(decoding: buffer.prefix(count), as: UTF8.self)
    }

    /// The next datagram, waiting up to `limit` for it (polling, so no thread is blocked); one
    /// look past the deadline too, since a loaded machine may not have run this task for long.
    func next(within limit: TimeInterval = 10) async throws -> String? {
        var datagram: String?
        _ = await eventually(timeout: limit) {
            datagram = poll()
            return datagram != nil
        }
        return datagram ?? poll()
    }
}

/// Sets (or unsets, with `nil`) environment variables for the duration of `body`.
func withEnvironment<T>(_ values: [String: String?], _ body: () async throws -> T) async rethrows -> T {
    let saved = values.keys.map { ($0, getenv($0).map { String(cString: $0) }) }
    for (name, value) in values {
        if let value { setenv(name, value, 1) } else { unsetenv(name) }
    }
    defer {
        for (name, value) in saved {
            if let value { setenv(name, value, 1) } else { unsetenv(name) }
        }
    }
    return try await body()
}

/// `sd_notify` against a real socket: each call is one datagram with exactly these lines.
@Suite(.serialized) struct SystemdNotifierTests {
    @Test func everyNotificationArrivesAsTheExactDatagramInOrder() async throws {
        let manager = try NotifySocket()
        try await withEnvironment(["NOTIFY_SOCKET": manager.path]) { () async throws in
            let notifier = SystemdNotifier()
            #expect(notifier.isEnabled)
            notifier.ready(status: "5 accounts: 4 valid, 1 needs login")
            notifier.reloading(monotonicMicroseconds: 123_456_789)
            notifier.stopping()
            notifier.send("EXTEND_TIMEOUT_USEC=5000000", "STATUS=raw")
            #expect(notifier.flush(timeout: .seconds(10)))
            var received: [String] = []
            while received.count < 4, let datagram = try await manager.next() { received.append(datagram) }
            #expect(
                received == [
                    "READY=1\nSTATUS=5 accounts: 4 valid, 1 needs login",
                    "RELOADING=1\nMONOTONIC_USEC=123456789",
                    "STOPPING=1",
                    "EXTEND_TIMEOUT_USEC=5000000\nSTATUS=raw",
                ])
            notifier.watchdog()
            #expect(try await manager.next() == "WATCHDOG=1")
            notifier.status("5 accounts: 5 valid")
            #expect(try await manager.next() == "STATUS=5 accounts: 5 valid")
            #expect(String(cString: getenv("NOTIFY_SOCKET")) == manager.path, "NOTIFY_SOCKET is kept for later calls")
        }
    }

    /// A burst of summaries is one STATUS= with the latest, and the next waits for its second.
    @Test func statusIsCoalescedToTheLatestAtMostAboutOnceASecond() async throws {
        let manager = try NotifySocket()
        try await withEnvironment(["NOTIFY_SOCKET": manager.path]) { () async throws in
            let notifier = SystemdNotifier()
            notifier.status("first")
            #expect(try await manager.next() == "STATUS=first")
            for index in 0..<1000 { notifier.status("burst \(index)") }
            notifier.watchdog()
            var received: [String] = []
            while !(received.contains("STATUS=burst 999") && received.contains("WATCHDOG=1")),
                let datagram = try await manager.next()
            {
                received.append(datagram)
            }
            // The ping is sent, whatever the status waits for (before it, or after it when the
            // second since the first ran out during the burst, as a loaded machine may take that
            // long over it); of the burst, the latest, and at most one more.
            let statuses = received.filter { $0.hasPrefix("STATUS=") }
            #expect(received.contains("WATCHDOG=1"), "\(received)")
            #expect(statuses.last == "STATUS=burst 999" && statuses.count <= 2, "\(received)")
            #expect(manager.poll() == nil, "nothing more for the whole burst")
        }
    }

    /// A manager that never reads: its queue fills, and every call still returns at once (a
    /// blocking `sendmsg` here would hang this test); the sender's thread waits alone. Released,
    /// the notifier sends nothing more: `sd_notify` reads `NOTIFY_SOCKET` for each datagram, so
    /// a thread sending on would reach whatever manager it names by then (here, the next one).
    @Test(.timeLimit(.minutes(1))) func aManagerThatNeverReadsBlocksNoCallerAndARemovedNotifierSendsNoMore()
        async throws
    {
        let manager = try NotifySocket()
        let next = try NotifySocket()
        try await withEnvironment(["NOTIFY_SOCKET": manager.path]) { () async throws in
            do {
                let notifier = SystemdNotifier()
                for index in 0..<10000 {
                    notifier.send("EXTEND_TIMEOUT_USEC=\(index)")
                    notifier.status("status \(index)")
                    notifier.watchdog()
                }
                #expect(!notifier.flush(timeout: .milliseconds(200)), "the manager's queue is full")
            }
            setenv("NOTIFY_SOCKET", next.path, 1)
            // Reading the queue lets the send in flight finish; nothing follows it.
            var received = 0
            while received < 11, try await manager.next(within: 1) != nil { received += 1 }
            #expect(received > 0)
            #expect(try await next.next(within: 0.5) == nil, "nothing sent after the notifier is gone")
        }
    }

    @Test func withoutNotifySocketNothingIsSent() async throws {
        await withEnvironment(["NOTIFY_SOCKET": nil]) {
            let notifier = SystemdNotifier()
            #expect(!notifier.isEnabled)
            notifier.ready(status: "0 accounts")
            #expect(notifier.flush(timeout: .zero))
        }
    }

    @Test func aNotifySocketNobodyListensOnLosesNothingElse() async throws {
        await withEnvironment(["NOTIFY_SOCKET": "/tmp/tbsd-nonexistent-\(UUID().uuidString.prefix(8))/notify"]) {
            let notifier = SystemdNotifier()
            notifier.ready(status: "0 accounts")
            #expect(notifier.flush(timeout: .seconds(10)), "a failed send is not retried")
        }
    }

    @Test func watchdogIntervalComesFromTheEnvironmentForThisProcessOnly() async throws {
        await withEnvironment(["WATCHDOG_USEC": "500000", "WATCHDOG_PID": "\(getpid())"]) {
            #expect(SystemdNotifier().watchdogInterval() == 500_000)
        }
        await withEnvironment(["WATCHDOG_USEC": "500000", "WATCHDOG_PID": "\(getpid() + 1)"]) {
            #expect(SystemdNotifier().watchdogInterval() == nil)
        }
        await withEnvironment(["WATCHDOG_USEC": nil, "WATCHDOG_PID": nil]) {
            #expect(SystemdNotifier().watchdogInterval() == nil)
        }
    }

    @Test func noInheritedSocketWithoutListenFDs() async throws {
        await withEnvironment(["LISTEN_FDS": nil, "LISTEN_PID": nil]) {
            #expect(SystemdNotifier().inheritedSocket() == nil)
        }
    }

    @Test(arguments: [true, false])
    func lifecycleReportsStatusChangesPetsTheWatchdogWhileHealthyAndSaysStopping(healthy: Bool) async throws {
        let manager = try NotifySocket()
        try await withEnvironment([
            "NOTIFY_SOCKET": manager.path, "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "\(getpid())",
        ]) {
            let summary = Summary("1 account: 1 valid")
            let notifier = SystemdNotifier()
            let lifecycle = SystemdLifecycle(notifier: notifier, summary: { summary.read() }, isHealthy: { healthy })
            let group = ServiceGroup(
                configuration: .init(
                    services: [lifecycle], logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })))
            let running = Task { try await group.run() }

            #expect(try await manager.next() == "STATUS=1 account: 1 valid")
            // A few more passes with an unchanged summary: no new STATUS=, a watchdog ping each.
            #expect(try await summary.waitForReads(3))
            summary.value = "1 account: 1 stale"
            var between: [String] = []
            var sawNewStatus = false
            while between.count < 200, let datagram = try await manager.next() {
                if datagram == "STATUS=1 account: 1 stale" {
                    sawNewStatus = true
                    break
                }
                between.append(datagram)
            }
            #expect(sawNewStatus, "a changed summary is sent as a new STATUS=")
            #expect(between.allSatisfy { $0 == "WATCHDOG=1" && healthy }, "\(between)")
            #expect(healthy ? between.count >= 2 : between.isEmpty, "\(between)")

            await group.triggerGracefulShutdown()
            try await running.value
            #expect(notifier.flush(timeout: .seconds(10)))
            var tail: [String] = []
            while let datagram = manager.poll() { tail.append(datagram) }
            #expect(tail.last == "STOPPING=1", "\(tail)")
            #expect(tail.dropLast().allSatisfy { $0 == "WATCHDOG=1" && healthy }, "\(tail)")
        }
    }
}

/// A summary string the test changes while the lifecycle service reads it, counting the reads.
final class Summary: Sendable {
    private let state: Mutex<(text: String, reads: Int)>

    init(_ text: String) { state = Mutex((text, 0)) }

    var value: String {
        get { state.withLock { $0.text } }
        set { state.withLock { $0.text = newValue } }
    }

    /// The summary, as the service asks for it on each pass.
    func read() -> String {
        state.withLock {
            $0.reads += 1
            return $0.text
        }
    }

    /// Waits (up to 10 s) until the service has asked at least `count` times.
    func waitForReads(_ count: Int) async throws -> Bool {
        await eventually(timeout: 10) { state.withLock { $0.reads } >= count }
    }
}

/// journald reads the `<N>` prefix as the entry's syslog priority.
@Suite struct JournalLogHandlerTests {
    @Test(arguments: [
        (Logger.Level.trace, 7), (.debug, 7), (.info, 6), (.notice, 5), (.warning, 4), (.error, 3), (.critical, 2),
    ])
    func priorityFollowsRFC5424(level: Logger.Level, priority: Int) {
        #expect(JournalLogHandler.priority(level) == priority)
    }

    @Test func everyLevelHasADistinctPriorityOrMoreSevereIsLower() {
        let priorities = Logger.Level.allCases.map(JournalLogHandler.priority)
        #expect(priorities == priorities.sorted(by: >), "more severe levels get lower numbers")
        #expect(priorities.allSatisfy { (0...7).contains($0) })
    }

    @Test func handlerKeepsMetadataAndLevel() {
        var handler = JournalLogHandler(label: "brokerd")
        #expect(handler.logLevel == .info)
        handler[metadataKey: "account"] = "api"
        #expect(handler[metadataKey: "account"] == "api")
        #expect(handler.metadata == ["account": "api"])
    }
}
