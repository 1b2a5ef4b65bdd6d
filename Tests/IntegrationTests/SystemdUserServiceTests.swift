import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// tokenbroker under a real `systemd --user` manager: unit verification, socket activation,
/// status, reload, watchdog restart of a wedged broker, clean stop. On a machine not booted
/// with systemd (CI), the test creates `/run/systemd/system` so the user manager starts, and
/// removes it afterwards.
@Suite(.serialized, .enabled(if: UserManager.isAvailable))
struct SystemdUserServiceTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test func unitsVerifyWithoutWarnings() throws {
        let manager = try UserManager(start: false)
        defer { manager.shutdown() }
        let result = try manager.run(
            "/usr/bin/systemd-analyze",
            ["--user", "verify"] + ["tokenbroker.socket", "tokenbroker.service"].map { manager.unitDirectory.appendingPathComponent($0).path })
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty, "\(result.output)")
    }

    @Test func socketActivationStatusReloadWatchdogAndStop() async throws {
        let manager = try UserManager(start: true)
        defer { manager.shutdown() }
        #expect(try manager.systemctl(["start", "tokenbroker.socket"]).status == 0)
        #expect(manager.show("tokenbroker.service", "ActiveState") == "inactive")

        // The first brokerctl call starts the service through the socket.
        let added = try manager.brokerctl(
            ["add", "api", "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"sd-token","expires_in":3600}"#)
        #expect(added.status == 0, "\(added.output)")
        let token = try manager.brokerctl(["token", "api"])
        #expect(token.output == "sd-token\n")
        #expect(manager.show("tokenbroker.service", "ActiveState") == "active")
        #expect(await manager.eventually { manager.show("tokenbroker.service", "StatusText") == "1 account: 1 valid" })

        // reload re-reads the config (RELOADING=1 ... READY=1 keeps the unit active).
        try "[accounts.declared]\nkind = \"static\"\n".write(
            to: manager.configHome.appendingPathComponent("tokenbroker/broker.toml"), atomically: true, encoding: .utf8)
        #expect(try manager.systemctl(["reload", "tokenbroker.service"]).status == 0)
        #expect(manager.show("tokenbroker.service", "ActiveState") == "active")
        #expect(try manager.brokerctl(["status"]).output.contains("declared"))

        // A wedged broker stops petting the watchdog; systemd kills and restarts it.
        let firstPID = manager.show("tokenbroker.service", "MainPID")
        // In the unit's state directory (the only place the sandboxed broker may delete it),
        // as systemd resolved it for the running broker.
        let environ = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(firstPID)/environ"))) ?? Data()
        let stateDirectory = environ.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
            .first { $0.hasPrefix("STATE_DIRECTORY=") }?.dropFirst("STATE_DIRECTORY=".count)
        let wedge = try #require(stateDirectory.map { "\($0)/wedge" })
        FileManager.default.createFile(atPath: wedge, contents: nil)
        let restarted = await manager.eventually(timeout: 40) {
            manager.show("tokenbroker.service", "NRestarts") == "1"
                && manager.show("tokenbroker.service", "ActiveState") == "active"
                && manager.show("tokenbroker.service", "MainPID") != firstPID
        }
        #expect(restarted)
        #expect(await manager.eventually { (try? manager.brokerctl(["token", "api"]).output) == "sd-token\n" })

        // stop: STOPPING=1 and a clean exit.
        #expect(try manager.systemctl(["stop", "tokenbroker.service"]).status == 0)
        #expect(manager.show("tokenbroker.service", "Result") == "success")
        #expect(manager.show("tokenbroker.service", "ExecMainStatus") == "0")
    }
}

/// A private `systemd --user` manager with tokenbroker's units installed for a temporary home.
final class UserManager: @unchecked Sendable {
    static let systemdBinary = ["/usr/lib/systemd/systemd", "/lib/systemd/systemd"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }
    static var isAvailable: Bool { getuid() == 0 && systemdBinary != nil }

    /// Outside /tmp: the unit runs with PrivateTmp=yes and would not see a binary there.
    let root = URL(fileURLWithPath: "/run/tbsd-\(UInt32.random(in: 0...UInt32.max))")
    var home: URL { root.appendingPathComponent("home") }
    var runtime: URL { root.appendingPathComponent("run") }
    var configHome: URL { home.appendingPathComponent(".config") }
    var unitDirectory: URL { configHome.appendingPathComponent("systemd/user") }
    private var manager: ChildProcess?
    private var createdBootMarker = false

    init(start: Bool) throws {
        let fileManager = FileManager.default
        for directory in [runtime, unitDirectory.appendingPathComponent("tokenbroker.service.d"),
            home.appendingPathComponent(".local/bin"), configHome.appendingPathComponent("tokenbroker")]
        {
            try fileManager.createDirectory(at: directory, withIntermediateDirectories: true)
        }
        chmod(runtime.path, 0o700)
        for unit in ["tokenbroker.service", "tokenbroker.socket"] {
            try fileManager.copyItem(
                at: SystemdUserServiceTests.repository.appendingPathComponent("systemd/\(unit)"),
                to: unitDirectory.appendingPathComponent(unit))
        }
        // %h is the user database's home, not this temporary one: point the test at its copy.
        let brokerd = home.appendingPathComponent(".local/bin/brokerd").path
        try "[Service]\nExecStart=\nExecStart=\(brokerd)\nWatchdogSec=2\nEnvironment=TOKENBROKER_TEST_WEDGE_FILE=%S/tokenbroker/wedge\n".write(
            to: unitDirectory.appendingPathComponent("tokenbroker.service.d/test.conf"), atomically: true, encoding: .utf8)
        try fileManager.copyItem(at: BrokerProcess.binary("brokerd"), to: URL(fileURLWithPath: brokerd))
        guard start else { return }
        if !fileManager.fileExists(atPath: "/run/systemd/system") {
            try fileManager.createDirectory(atPath: "/run/systemd/system", withIntermediateDirectories: true)
            createdBootMarker = true
        }
        manager = try ChildProcess.spawn(Self.systemdBinary!, ["--user"], environment: environment)
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            let state = (try? systemctl(["is-system-running"]))?.output ?? ""
            if state.hasPrefix("running") || state.hasPrefix("degraded") { return }
            usleep(100_000)
        }
        throw HarnessError("systemd --user did not come up")
    }

    var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = home.path
        environment["XDG_RUNTIME_DIR"] = runtime.path
        environment["XDG_CONFIG_HOME"] = configHome.path
        environment["XDG_STATE_HOME"] = home.appendingPathComponent(".local/state").path
        environment["TOKENBROKER_SOCKET"] = runtime.appendingPathComponent("tokenbroker/broker.sock").path
        for name in ["DBUS_SESSION_BUS_ADDRESS", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "TOKENBROKER_CONFIG",
            "TOKENBROKER_VAULT", "TOKENBROKER_KEY_FILE"]
        {
            environment[name] = nil
        }
        return environment
    }

    /// Stops every unit, ends the manager (waiting for it), and removes what the test created.
    func shutdown() {
        if let manager {
            _ = try? systemctl(["stop", "tokenbroker.service", "tokenbroker.socket"])
            _ = try? systemctl(["exit"])
            let deadline = Date().addingTimeInterval(15)
            var exited = manager.hasExited()
            while !exited, Date() < deadline {
                usleep(50_000)
                exited = manager.hasExited()
            }
            if !exited {
                kill(manager.pid, SIGKILL)
                manager.wait()
            }
        }
        if createdBootMarker { rmdir("/run/systemd/system") }
        try? FileManager.default.removeItem(at: root)
    }

    func systemctl(_ arguments: [String]) throws -> (status: Int32, output: String) {
        try run("/usr/bin/systemctl", ["--user"] + arguments)
    }

    /// One property of a unit, as `systemctl show` prints it.
    func show(_ unit: String, _ property: String) -> String {
        let output = (try? systemctl(["show", "-p", property, "--value", unit]))?.output ?? ""
        return output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func brokerctl(_ arguments: [String], stdin: String? = nil) throws -> (status: Int32, output: String) {
        try run(BrokerProcess.binary("brokerctl").path, arguments, stdin: stdin)
    }

    /// Runs a command with this manager's environment; returns its status and stdout+stderr.
    func run(_ path: String, _ arguments: [String], stdin: String? = nil) throws -> (status: Int32, output: String) {
        try ChildProcess.run(path, arguments, environment: environment, stdin: stdin)
    }

    func eventually(timeout: TimeInterval = 15, _ condition: () -> Bool) async -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(200))
        }
        return condition()
    }
}
