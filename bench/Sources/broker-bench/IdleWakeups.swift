import FoundationEssentials
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `broker-bench idle`: how often an idle brokerd wakes, as the context switches of all its
/// threads (voluntary and involuntary, /proc/PID/task/*/status) over `seconds`, with one
/// static account valid for an hour: without a watchdog, and with `WATCHDOG_USEC=30000000`
/// (its pings counted on a notify socket of the bench's own), beside `ssh-agent -D` holding no
/// key, measured at the same time when it is installed. Prints `key=value` lines for
/// `broker-bench table`; every process it starts is stopped and waited for.
enum IdleWakeups {
    /// Seconds each process is left to settle before counting.
    static let settle: UInt32 = 3

    static func run(brokerd: String, seconds: UInt32) async throws {
        let workspace = try TemporaryDirectory()
        defer { workspace.remove() }
        let plain = try BrokerProcess(brokerd: brokerd)
        let watched = try BrokerProcess(brokerd: brokerd)
        let notify = try DatagramListener(path: workspace.file("notify.sock"))
        try await plain.start()
        defer { plain.stop() }
        try await watched.start(environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "30000000"])
        defer { watched.stop() }
        for broker in [plain, watched] { try broker.addStaticAccounts(range: 0..<1) }
        let agent = try sshAgent(socket: workspace.file("agent.sock"))
        defer { _ = agent?.stop() }

        sleep(settle)
        // Datagrams of the settling time (READY=1, STATUS=, pings) are not counted.
        while notify.receiveQueued() != nil {}
        let processes = [plain.process, watched.process, agent].compactMap { $0 }
        let before = processes.map { $0.contextSwitches() }
        sleep(seconds)
        let woke = zip(processes, before).map { Double($0.contextSwitches().since($1)) }
        var pings = 0
        while let datagram = notify.receiveQueued() {
            if datagram == "WATCHDOG=1" { pings += 1 }
        }
        print("idle_wakeups=\(woke[0]) idle_watchdog_wakeups=\(woke[1]) idle_watchdog_pings=\(pings)")
        print(agent == nil ? "ssh_agent_absent=1" : "ssh_agent_wakeups=\(woke[2])")
    }

    /// `ssh-agent -D` in the foreground on `socket`, once it listens; nil when it is not installed.
    private static func sshAgent(socket: String) throws -> ChildProcess? {
        let installed = ["/usr/bin/ssh-agent", "/bin/ssh-agent"]
        guard let path = installed.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            return nil
        }
        let agent = try ChildProcess.spawn(path, ["-D", "-a", socket], environment: [:])
        _ = try RawConnection(path: socket, waitingUpTo: 5)
        return agent
    }
}
