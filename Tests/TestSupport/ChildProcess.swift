import FoundationEssentials
import ProcessSpawn
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A child started with `ProcessSpawn` and reaped with waitpid. Foundation's `Process` on Linux
/// learns of a child's exit through a descriptor that grandchildren inherit, so a command that
/// talks to a service manager can look alive forever; this does not. Every child must be
/// waited for (`wait`, or `hasExited` until it says so): PID 1 here does not reap orphans.
public final class ChildProcess: Sendable {
    public let pid: pid_t
    /// The exit status once reaped (128 + signal when killed).
    private let status = Mutex<Int32?>(nil)

    private init(pid: pid_t) { self.pid = pid }

    /// Starts `path` with `arguments` and exactly `environment`. Standard input comes from
    /// `input` (or /dev/null); standard output goes to `output` and standard error to `errors`
    /// (default: where standard output goes; /dev/null when neither is given).
    public static func spawn(
        _ path: String, _ arguments: [String], environment: [String: String], input: Int32? = nil,
        output: Int32? = nil, errors: Int32? = nil
    ) throws -> ChildProcess {
        // NIO's sockets are not close-on-exec: ProcessSpawn keeps the listeners of the tests
        // running beside it in this process (an IdP, a login's redirect port) out of the child.
        var spawn = ProcessSpawn()
        spawn.standardInput = input.map { .descriptor($0) } ?? .devNull
        spawn.standardOutput = output.map { .descriptor($0) } ?? .devNull
        spawn.standardError = (errors ?? output).map { .descriptor($0) } ?? .devNull
        switch spawn.start([path] + arguments, environment: environment.map { "\($0.key)=\($0.value)" }) {
        case .success(let pid): return ChildProcess(pid: pid)
        case .failure(let failure): throw HarnessError("cannot start \(path): \(failure)")
        }
    }

    /// Runs a command to completion (killed after `timeout` seconds); returns its status, its
    /// standard output and its standard error.
    public static func capture(
        _ path: String, _ arguments: [String], environment: [String: String], stdin: String? = nil,
        timeout: TimeInterval = 60
    ) throws -> (status: Int32, stdout: String, stderr: String) {
        let input = try Pipe()
        let output = try Pipe()
        let errors = try Pipe()
        let child = try spawn(
            path, arguments, environment: environment, input: input.reading, output: output.writing,
            errors: errors.writing)
        input.closeReading()
        output.closeWriting()
        errors.closeWriting()
        if let stdin { _ = Array(stdin.utf8).withUnsafeBytes { write(input.writing, $0.baseAddress, $0.count) } }
        input.closeWriting()
        let (out, err, timedOut) = readAll(output.reading, errors.reading, timeout: timeout)
        output.closeReading()
        errors.closeReading()
        if timedOut { kill(child.pid, SIGKILL) }
        return (child.wait(), String(decoding: out, as: UTF8.self), String(decoding: err, as: UTF8.self))
    }

    /// Runs a command to completion (killed after `timeout` seconds); returns its status and
    /// its standard output and error together.
    public static func run(
        _ path: String, _ arguments: [String], environment: [String: String], stdin: String? = nil,
        timeout: TimeInterval = 60
    ) throws -> (status: Int32, output: String) {
        let input = try Pipe()
        let output = try Pipe()
        let child = try spawn(path, arguments, environment: environment, input: input.reading, output: output.writing)
        input.closeReading()
        output.closeWriting()
        if let stdin { _ = Array(stdin.utf8).withUnsafeBytes { write(input.writing, $0.baseAddress, $0.count) } }
        input.closeWriting()
        let (out, _, timedOut) = readAll(output.reading, nil, timeout: timeout)
        output.closeReading()
        if timedOut { kill(child.pid, SIGKILL) }
        return (child.wait(), String(decoding: out, as: UTF8.self))
    }

    /// `capture` for tasks: the command runs, and is waited for, on a thread of its own, not on
    /// one of the few threads every test's tasks share.
    public static func capture(
        _ path: String, _ arguments: [String], environment: [String: String], stdin: String? = nil,
        timeout: TimeInterval = 60
    ) async throws -> (status: Int32, stdout: String, stderr: String) {
        try await onOwnThread { try capture(path, arguments, environment: environment, stdin: stdin, timeout: timeout) }
    }

    /// `run` for tasks: the command runs, and is waited for, on a thread of its own.
    public static func run(
        _ path: String, _ arguments: [String], environment: [String: String], stdin: String? = nil,
        timeout: TimeInterval = 60
    ) async throws -> (status: Int32, output: String) {
        try await onOwnThread { try run(path, arguments, environment: environment, stdin: stdin, timeout: timeout) }
    }

    /// Waits for the child and returns its exit status (128 + signal when killed).
    @discardableResult
    public func wait() -> Int32 {
        status.withLock { status in
            if let status { return status }
            var raw: Int32 = 0
            while waitpid(pid, &raw, 0) < 0, errno == EINTR {}
            status = Self.decode(raw)
            return status!
        }
    }

    /// Whether the child has exited (reaping it if so; `wait` then returns its status).
    public func hasExited() -> Bool {
        status.withLock { status in
            if status != nil { return true }
            var raw: Int32 = 0
            guard waitpid(pid, &raw, WNOHANG) == pid else { return false }
            status = Self.decode(raw)
            return true
        }
    }

    /// SIGTERM, and SIGKILL if the child is still there `grace` seconds later; waits for it
    /// either way and returns its exit status.
    @discardableResult
    public func stop(grace: Double = 10) -> Int32 {
        if !hasExited() { kill(pid, SIGTERM) }
        if !Poll.blocking(timeout: grace, { hasExited() }) { kill(pid, SIGKILL) }
        return wait()
    }

    /// The child's resident memory in KiB: `VmRSS` in /proc/PID/status, or another of its
    /// figures in KiB (`RssAnon`, `RssFile`).
    public func residentKiB(_ field: String = "VmRSS") throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") }),
            let kib = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) })
        else { throw HarnessError("no \(field) for pid \(pid)") }
        return kib
    }

    /// The CPU time (user and system) the child has used, in seconds.
    public func cpuSeconds() -> Double {
        let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
        // Fields after the command name, which is in parentheses and may hold spaces.
        let fields = stat.split(separator: ")").last?.split(separator: " ") ?? []
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return .nan }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// The context switches (voluntary and involuntary) of each of the child's threads so far,
    /// from /proc/PID/task/*/status: when the child is idle, each is a wake-up.
    public func contextSwitches() -> ContextSwitches {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        var byThread: [String: Int] = [:]
        for task in tasks {
            guard let status = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)
            else { continue }
            byThread[task] = status.split(separator: "\n").reduce(0) { sum, line in
                guard line.hasPrefix("voluntary_ctxt_switches:") || line.hasPrefix("nonvoluntary_ctxt_switches:")
                else { return sum }
                return sum + (line.split(separator: "\t").last.flatMap { Int($0) } ?? 0)
            }
        }
        return ContextSwitches(byThread: byThread)
    }

    /// How many of the child's threads have a name starting with `prefix`.
    public func threads(named prefix: String) -> Int {
        threadNames().filter { $0.hasPrefix(prefix) }.count
    }

    /// The names of the child's threads (`/proc/PID/task/*/comm`).
    public func threadNames() -> [String] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.map { task in
            (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/comm", encoding: .utf8)) ?? ""
        }
    }

    private static func decode(_ raw: Int32) -> Int32 {
        let signal = raw & 0x7F
        return signal == 0 ? (raw >> 8) & 0xFF : 128 + signal
    }

    /// Reads two descriptors to their ends, or until `timeout`; says whether it timed out.
    private static func readAll(_ first: Int32, _ second: Int32?, timeout: TimeInterval) -> (
        [UInt8], [UInt8], Bool
    ) {
        let deadline = ContinuousClock.now + .milliseconds(Int64(timeout * 1000))
        var collected: [[UInt8]] = [[], []]
        var open = [first, second ?? -1]
        var buffer = [UInt8](repeating: 0, count: 65536)
        while open.contains(where: { $0 >= 0 }) {
            guard ContinuousClock.now < deadline else { return (collected[0], collected[1], true) }
            var pollers = open.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            guard poll(&pollers, nfds_t(pollers.count), 200) > 0 else { continue }
            for index in pollers.indices where pollers[index].fd >= 0 && pollers[index].revents != 0 {
                let count = read(pollers[index].fd, &buffer, buffer.count)
                if count > 0 {
                    collected[index] += buffer[0..<count]
                } else {
                    open[index] = -1
                }
            }
        }
        return (collected[0], collected[1], false)
    }
}

/// A close-on-exec pipe whose ends are closed once.
private final class Pipe {
    private var ends: [Int32] = [-1, -1]

    init() throws {
        guard pipe(&ends) == 0 else { throw HarnessError("pipe failed: errno \(errno)") }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
    }

    var reading: Int32 { ends[0] }
    var writing: Int32 { ends[1] }

    func closeReading() { close(index: 0) }
    func closeWriting() { close(index: 1) }

    private func close(index: Int) {
        if ends[index] >= 0 { Glibc.close(ends[index]) }
        ends[index] = -1
    }

    deinit {
        closeReading()
        closeWriting()
    }
}

/// The context switches of each thread of a process at one moment (`ChildProcess.contextSwitches`).
public struct ContextSwitches: Sendable {
    public let byThread: [String: Int]

    /// The wake-ups since `earlier`: each thread's switches since then (all of a new thread's),
    /// and one for each thread that has exited (its own count went with it).
    public func since(_ earlier: ContextSwitches) -> Int {
        let ran = byThread.reduce(0) { $0 + $1.value - (earlier.byThread[$1.key] ?? 0) }
        return ran + earlier.byThread.keys.filter { byThread[$0] == nil }.count
    }
}
