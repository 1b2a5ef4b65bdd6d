import BrokerClient
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The real `brokerd` binary (the live-process harness), started with `ProcessSpawn` in a
/// private temporary home with its own socket, config, state and key; stopped by PID and
/// always waited for.
public final class BrokerProcess: @unchecked Sendable {
    public let root: URL
    /// The brokerd binary this runs.
    public let brokerd: String
    /// The running brokerd, nil when it is not running.
    public private(set) var process: ChildProcess?
    /// Commands that each exec the next, brokerd last, to start it under (`prlimit ... --`):
    /// the PID stays brokerd's.
    public var launcher: [String] = []

    /// A broker home for `brokerd` (default: the one built beside this program).
    public init(brokerd: String = BrokerProcess.binary("brokerd").path) throws {
        self.brokerd = brokerd
        root = URL(fileURLWithPath: "/tmp/tbt-\(UInt32.random(in: 0...UInt32.max))")
        for directory in ["home", "run", "config", "state"] {
            try FileManager.default.createDirectory(
                at: root.appendingPathComponent(directory), withIntermediateDirectories: true)
        }
    }

    deinit {
        if let process, !process.hasExited() {
            kill(process.pid, SIGKILL)
            process.wait()
        }
        if ProcessInfo.processInfo.environment["TB_KEEP"] == nil { try? FileManager.default.removeItem(at: root) }
    }

    /// The running brokerd's PID, -1 when it is not running.
    public var pid: pid_t { process?.pid ?? -1 }
    public var socketPath: String { root.appendingPathComponent("run/tokenbroker/broker.sock").path }
    public var configDirectory: URL { root.appendingPathComponent("config/tokenbroker") }
    public var stateDirectory: URL { root.appendingPathComponent("state/tokenbroker") }
    public var vaultPath: String { stateDirectory.appendingPathComponent("vault").path }
    public var keyPath: String { configDirectory.appendingPathComponent("vault.key").path }
    public var logPath: String { root.appendingPathComponent("brokerd.log").path }
    public var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    public var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = root.appendingPathComponent("home").path
        environment["XDG_RUNTIME_DIR"] = root.appendingPathComponent("run").path
        environment["XDG_CONFIG_HOME"] = root.appendingPathComponent("config").path
        environment["XDG_STATE_HOME"] = root.appendingPathComponent("state").path
        for name in [
            "TOKENBROKER_SOCKET", "TOKENBROKER_CONFIG", "TOKENBROKER_VAULT", "TOKENBROKER_KEY_FILE",
            "TOKENBROKER_LOG_LEVEL",
            "CREDENTIALS_DIRECTORY", "STATE_DIRECTORY", "CONFIGURATION_DIRECTORY", "NOTIFY_SOCKET", "LISTEN_FDS",
            "LISTEN_PID", "WATCHDOG_USEC", "WATCHDOG_PID",
            // No desktop notification reaches the session of whoever runs the tests.
            "DBUS_SESSION_BUS_ADDRESS",
        ] {
            environment[name] = nil
        }
        return environment
    }

    /// Starts brokerd with `NOTIFY_SOCKET` set and returns at once, without probing the socket.
    public func startWithNotifySocket(_ path: String) async throws {
        process = try launch(brokerd, arguments: [], extraEnvironment: ["NOTIFY_SOCKET": path])
    }

    /// Starts brokerd and waits until its socket answers (`timeout` seconds at most); throws
    /// with its log if it exits instead.
    public func start(arguments: [String] = [], environment extra: [String: String] = [:], timeout: TimeInterval = 30)
        async throws
    {
        let process = try launch(brokerd, arguments: arguments, extraEnvironment: extra)
        self.process = process
        // `eventually` looks once more past the deadline: on a loaded machine this task may not
        // have run for a while (the cooperative threads busy with other suites) while brokerd came up.
        let answered = await eventually(timeout: timeout) {
            if process.hasExited() { return true }
            guard let client = try? BrokerClient(socketPath: socketPath) else { return false }
            client.close()
            return true
        }
        if process.hasExited() {
            self.process = nil
            throw HarnessError("brokerd exited with \(process.wait()): \(log)")
        }
        guard answered else { throw HarnessError("brokerd did not open its socket in time: \(log)") }
    }

    /// Sends SIGTERM and waits; returns the exit status.
    @discardableResult
    public func stop() -> Int32 {
        guard let process else { return -1 }
        self.process = nil
        // SIGKILL after 60 s: a broker wedged in its shutdown fails its test instead of holding
        // the whole suite.
        return process.stop(grace: 60)
    }

    /// The running brokerd's resident memory in KiB (`VmRSS` in /proc/PID/status, or `field`).
    public func residentKiB(_ field: String = "VmRSS") throws -> Int {
        guard let process else { throw HarnessError("brokerd is not running") }
        return try process.residentKiB(field)
    }

    /// Sends `signal` to the running brokerd.
    public func signal(_ signal: Int32) {
        if let process { kill(process.pid, signal) }
    }

    /// Writes `text` as the broker's `broker.toml`.
    public func writeConfig(_ text: String) throws {
        try FileManager.default.createDirectory(at: configDirectory, withIntermediateDirectories: true)
        try text.write(to: configDirectory.appendingPathComponent("broker.toml"), atomically: true, encoding: .utf8)
    }

    /// Kills brokerd with SIGKILL (no chance to clean up) and waits for it.
    public func crash() {
        guard let process else { return }
        self.process = nil
        kill(process.pid, SIGKILL)
        process.wait()
    }

    /// Runs brokerd expecting it to exit by itself (e.g. refusing to start); returns its status.
    /// Waits for it on a thread of its own.
    public func runExpectingExit(timeout: TimeInterval = 30) async throws -> Int32 {
        let process = try launch(brokerd, arguments: [])
        return try await onOwnThread {
            if !Poll.blocking(timeout: timeout, { process.hasExited() }) { kill(process.pid, SIGKILL) }
            return process.wait()
        }
    }

    /// Runs brokerctl against this broker; returns exit status, stdout and stderr. It waits on a
    /// thread of its own: brokerctl waits for the broker (seconds for an Argon2id unlock, a login
    /// or a hung IdP), which must not hold a thread of the cooperative pool that other tests'
    /// tasks (an IdP's answer, an approver) need.
    public func brokerctl(_ arguments: [String], stdin: String? = nil) async throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        let environment = self.environment.merging(["TOKENBROKER_SOCKET": socketPath]) { $1 }
        return try await onOwnThread {
            try ChildProcess.capture(
                Self.binary("brokerctl").path, arguments, environment: environment, stdin: stdin)
        }
    }

    /// Every file under the broker's config and state directories, as bytes.
    public func storedFiles() -> [(path: String, bytes: Data)] {
        [configDirectory, stateDirectory].flatMap { directory -> [(String, Data)] in
            let paths = (FileManager.default.enumerator(atPath: directory.path)?.allObjects as? [String]) ?? []
            return paths.compactMap { path in
                let full = directory.appendingPathComponent(path).path
                return FileManager.default.contents(atPath: full).map { (full, $0) }
            }
        }
    }

    public func client() throws -> BrokerClient { try BrokerClient(socketPath: socketPath) }

    /// Starts `binary` with its standard output and error appended to the broker's log.
    private func launch(_ binary: String, arguments: [String], extraEnvironment: [String: String] = [:]) throws
        -> ChildProcess
    {
        let log = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard log >= 0 else { throw HarnessError("cannot open \(logPath): errno \(errno)") }
        defer { close(log) }
        let command = launcher + [binary] + arguments
        return try ChildProcess.spawn(
            command[0], Array(command.dropFirst()), environment: environment.merging(extraEnvironment) { $1 },
            output: log)
    }

    /// A product built next to this test bundle (the same `.build/<config>` directory).
    public static func binary(_ name: String) -> URL {
        let candidates = [
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent(),
            Bundle.main.bundleURL, Bundle.main.bundleURL.deletingLastPathComponent(),
        ]
        for directory in candidates {
            let url = directory.appendingPathComponent(name)
            if FileManager.default.isExecutableFile(atPath: url.path) { return url }
        }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/debug/\(name)")
    }
}

/// A test harness could not do what it was asked.
public struct HarnessError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

extension Data {
    /// Whether `needle` occurs anywhere in these bytes.
    public func contains(_ needle: String) -> Bool { range(of: Data(needle.utf8)) != nil }
}
