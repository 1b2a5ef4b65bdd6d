import BrokerProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Nothing a crash leaves behind may hold a secret. brokerd can never write a
/// core file and is not dumpable; the unit turns the Swift backtracer off.
@Suite struct CrashOutputTests {
    static let otherUID: uid_t = 65534

    @Test func theUnitTurnsTheBacktracerAndCoreFilesOff() throws {
        let unit = try String(
            contentsOf: SystemdUserServiceTests.repository.appendingPathComponent("systemd/tokenbroker.service"),
            encoding: .utf8)
        let lines = unit.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        #expect(lines.contains("Environment=SWIFT_BACKTRACE=enable=no"))
        #expect(lines.contains("LimitCORE=0"))
    }

    /// Run as an ordinary user (uid 65534): only then does non-dumpable show from outside, as
    /// /proc/PID files that belong to root instead of the process's own uid.
    @Test(.enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")))
    func brokerdCannotDumpCoreAndIsNotDumpable() async throws {
        let broker = try BrokerProcess()
        for name in ["home", "run", "config", "state"] {
            chown(broker.root.appendingPathComponent(name).path, Self.otherUID, gid_t(Self.otherUID))
        }
        let brokerd = try Self.spawnAsOtherUser(
            [BrokerProcess.binary("brokerd").path], broker.environment, log: broker.logPath)
        defer {
            kill(brokerd.pid, SIGTERM)
            brokerd.wait()
        }
        let socket = broker.socketPath
        guard await eventually(timeout: 30, { Self.answers(socket) || brokerd.hasExited() }), !brokerd.hasExited()
        else { throw HarnessError("brokerd did not start: \(broker.log)") }

        let limits = try String(contentsOfFile: "/proc/\(brokerd.pid)/limits", encoding: .utf8)
        let core = try #require(limits.split(separator: "\n").first { $0.hasPrefix("Max core file size") })
        #expect(Array(core.split(separator: " ").dropFirst(4).prefix(2)) == ["0", "0"], "soft and hard: \(core)")

        #expect(Self.uid(ofProcess: brokerd.pid) == Self.otherUID)
        #expect(Self.owner(of: "/proc/\(brokerd.pid)/environ") == 0, "non-dumpable: its /proc files are root's")

        // The same check tells an ordinary process of that user apart.
        let ordinary = try Self.spawnAsOtherUser(["/bin/sleep", "30"], [:], log: "/dev/null")
        defer {
            kill(ordinary.pid, SIGKILL)
            ordinary.wait()
        }
        // (setpriv is not dumpable after it changes uid; sleep is once setpriv has exec'd it.)
        #expect(await eventually { Self.owner(of: "/proc/\(ordinary.pid)/environ") == Self.otherUID })
    }

    /// Starts `command` as uid 65534 with `environment`, its output appended to `log`.
    private static func spawnAsOtherUser(_ command: [String], _ environment: [String: String], log: String) throws
        -> ChildProcess
    {
        let output = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard output >= 0 else { throw HarnessError("cannot open \(log)") }
        defer { close(output) }
        return try ChildProcess.spawn(
            "/usr/bin/setpriv",
            ["--reuid=\(otherUID)", "--regid=\(otherUID)", "--clear-groups"] + command, environment: environment,
            output: output)
    }

    /// Whether something accepts connections on `path` (no check of who: this test runs as root).
    private static func answers(_ path: String) -> Bool {
        guard case .success(let fd) = UnixSocketAddress.connect(path) else { return false }
        close(fd)
        return true
    }

    /// The real uid of process `pid`, from /proc/PID/status.
    private static func uid(ofProcess pid: pid_t) -> uid_t? {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("Uid:") }
        return line?.split(whereSeparator: \.isWhitespace).dropFirst().first.flatMap { uid_t($0) }
    }

    private static func owner(of path: String) -> uid_t? {
        var info = stat()
        return lstat(path, &info) == 0 ? info.st_uid : nil
    }
}
