import BrokerClient
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The real `brokerd` binary, started in a private temporary home with its own socket,
/// config, state and key; stopped by PID and always waited for.
final class BrokerProcess: @unchecked Sendable {
    let root: URL
    private var process: Process?

    init() throws {
        root = URL(fileURLWithPath: "/tmp/tbt-\(UInt32.random(in: 0...UInt32.max))")
        for directory in ["home", "run", "config", "state"] {
            try FileManager.default.createDirectory(
                at: root.appendingPathComponent(directory), withIntermediateDirectories: true)
        }
    }

    deinit {
        if let process, process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        if ProcessInfo.processInfo.environment["TB_KEEP"] == nil { try? FileManager.default.removeItem(at: root) }
    }

    var socketPath: String { root.appendingPathComponent("run/tokenbroker/broker.sock").path }
    var configDirectory: URL { root.appendingPathComponent("config/tokenbroker") }
    var stateDirectory: URL { root.appendingPathComponent("state/tokenbroker") }
    var vaultPath: String { stateDirectory.appendingPathComponent("vault").path }
    var keyPath: String { configDirectory.appendingPathComponent("vault.key").path }
    var logPath: String { root.appendingPathComponent("brokerd.log").path }
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = root.appendingPathComponent("home").path
        environment["XDG_RUNTIME_DIR"] = root.appendingPathComponent("run").path
        environment["XDG_CONFIG_HOME"] = root.appendingPathComponent("config").path
        environment["XDG_STATE_HOME"] = root.appendingPathComponent("state").path
        for name in [
            "TOKENBROKER_SOCKET", "TOKENBROKER_CONFIG", "TOKENBROKER_VAULT", "TOKENBROKER_KEY_FILE",
            "CREDENTIALS_DIRECTORY", "STATE_DIRECTORY", "CONFIGURATION_DIRECTORY", "NOTIFY_SOCKET", "LISTEN_FDS",
            "LISTEN_PID", "WATCHDOG_USEC", "WATCHDOG_PID",
        ] {
            environment[name] = nil
        }
        return environment
    }

    /// Starts brokerd with `NOTIFY_SOCKET` set and returns at once, without probing the socket.
    func startWithNotifySocket(_ path: String) async throws {
        process = try launch(Self.binary("brokerd"), arguments: [], extraEnvironment: ["NOTIFY_SOCKET": path])
    }

    /// Starts brokerd and waits until its socket answers; throws with its log if it exits instead.
    func start(arguments: [String] = [], environment extra: [String: String] = [:]) async throws {
        let process = try launch(Self.binary("brokerd"), arguments: arguments, extraEnvironment: extra)
        self.process = process
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if !process.isRunning {
                process.waitUntilExit()
                throw HarnessError("brokerd exited with \(process.terminationStatus): \(log)")
            }
            if let client = try? BrokerClient(socketPath: socketPath) {
                client.close()
                return
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw HarnessError("brokerd did not open its socket in time: \(log)")
    }

    /// Sends SIGTERM and waits; returns the exit status.
    @discardableResult
    func stop() -> Int32 {
        guard let process else { return -1 }
        self.process = nil
        if process.isRunning { kill(process.processIdentifier, SIGTERM) }
        process.waitUntilExit()
        return process.terminationStatus
    }

    /// The running brokerd's process id.
    var pid: pid_t? { process?.processIdentifier }

    /// The running brokerd's resident memory in KiB (`VmRSS` in /proc/PID/status).
    func residentKiB() throws -> Int {
        guard let pid else { throw HarnessError("brokerd is not running") }
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
            let kib = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) })
        else { throw HarnessError("no VmRSS for pid \(pid)") }
        return kib
    }

    /// Sends `signal` to the running brokerd.
    func signal(_ signal: Int32) {
        if let process { kill(process.processIdentifier, signal) }
    }

    /// Writes `text` as the broker's `broker.toml`.
    func writeConfig(_ text: String) throws {
        try FileManager.default.createDirectory(at: configDirectory, withIntermediateDirectories: true)
        try text.write(to: configDirectory.appendingPathComponent("broker.toml"), atomically: true, encoding: .utf8)
    }

    /// Kills brokerd with SIGKILL (no chance to clean up) and waits for it.
    func crash() {
        guard let process else { return }
        self.process = nil
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    /// Runs brokerd expecting it to exit by itself (e.g. refusing to start); returns its status.
    func runExpectingExit(timeout: TimeInterval = 30) throws -> Int32 {
        let process = try launch(Self.binary("brokerd"), arguments: [])
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning, Date() < deadline { usleep(20_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        return process.terminationStatus
    }

    /// Runs brokerctl against this broker; returns exit status, stdout and stderr.
    func brokerctl(_ arguments: [String], stdin: String? = nil) throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        let process = Process()
        process.executableURL = Self.binary("brokerctl")
        process.arguments = arguments
        process.environment = environment.merging(["TOKENBROKER_SOCKET": socketPath]) { $1 }
        let output = Pipe()
        let errors = Pipe()
        let input = Pipe()
        process.standardOutput = output
        process.standardError = errors
        process.standardInput = input
        try process.run()
        if let stdin { input.fileHandleForWriting.write(Data(stdin.utf8)) }
        try input.fileHandleForWriting.close()
        let pid = process.processIdentifier
        DispatchQueue.global().asyncAfter(deadline: .now() + 60) { [process] in
            if process.isRunning { kill(pid, SIGKILL) }
        }
        let out = output.fileHandleForReading.readDataToEndOfFile()
        let err = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: out, as: UTF8.self), String(decoding: err, as: UTF8.self))
    }

    /// Every file under the broker's config and state directories, as bytes.
    func storedFiles() -> [(path: String, bytes: Data)] {
        [configDirectory, stateDirectory].flatMap { directory -> [(String, Data)] in
            let paths = (FileManager.default.enumerator(atPath: directory.path)?.allObjects as? [String]) ?? []
            return paths.compactMap { path in
                let full = directory.appendingPathComponent(path).path
                return FileManager.default.contents(atPath: full).map { (full, $0) }
            }
        }
    }

    func client() throws -> BrokerClient { try BrokerClient(socketPath: socketPath) }

    private func launch(_ binary: URL, arguments: [String], extraEnvironment: [String: String] = [:]) throws
        -> Process
    {
        let process = Process()
        process.executableURL = binary
        process.arguments = arguments
        process.environment = environment.merging(extraEnvironment) { $1 }
        if !FileManager.default.fileExists(atPath: logPath) {
            _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        }
        let logHandle = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        logHandle.seekToEndOfFile()
        process.standardError = logHandle
        process.standardOutput = logHandle
        try process.run()
        return process
    }

    /// A product built next to this test bundle (the same `.build/<config>` directory).
    static func binary(_ name: String) -> URL {
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

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension Data {
    /// Whether `needle` occurs anywhere in these bytes.
    func contains(_ needle: String) -> Bool { range(of: Data(needle.utf8)) != nil }
}
