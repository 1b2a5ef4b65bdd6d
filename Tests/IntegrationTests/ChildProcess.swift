import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// A child started with posix_spawn and reaped with waitpid. Foundation's `Process` on Linux
/// learns of a child's exit through a descriptor that grandchildren inherit, so a command that
/// talks to a service manager can look alive forever; this does not.
struct ChildProcess {
    let pid: pid_t

    /// Starts `path` with `arguments` and `environment`; stdout and stderr go to `output` (or /dev/null).
    static func spawn(
        _ path: String, _ arguments: [String], environment: [String: String], input: Int32? = nil,
        output: Int32? = nil
    ) throws -> ChildProcess {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if let input {
            posix_spawn_file_actions_adddup2(&actions, input, 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        if let output {
            posix_spawn_file_actions_adddup2(&actions, output, 1)
            posix_spawn_file_actions_adddup2(&actions, output, 2)
        } else {
            posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        }
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { (argv + envp).forEach { free($0) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, path, &actions, nil, argv, envp)
        guard result == 0 else { throw HarnessError("cannot start \(path): \(String(cString: strerror(result)))") }
        return ChildProcess(pid: pid)
    }

    /// Runs a command to completion (killed after `timeout` seconds); returns its status and output.
    static func run(
        _ path: String, _ arguments: [String], environment: [String: String], stdin: String? = nil,
        timeout: TimeInterval = 60
    ) throws -> (status: Int32, output: String) {
        var outputPipe: [Int32] = [0, 0]
        var inputPipe: [Int32] = [0, 0]
        guard pipe(&outputPipe) == 0, pipe(&inputPipe) == 0 else { throw HarnessError("pipe failed") }
        for fd in outputPipe + inputPipe { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        let child = try spawn(path, arguments, environment: environment, input: inputPipe[0], output: outputPipe[1])
        close(outputPipe[1])
        close(inputPipe[0])
        if let stdin { _ = Array(stdin.utf8).withUnsafeBytes { write(inputPipe[1], $0.baseAddress, $0.count) } }
        close(inputPipe[1])
        let deadline = Date().addingTimeInterval(timeout)
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        var poller = pollfd(fd: outputPipe[0], events: Int16(POLLIN), revents: 0)
        while Date() < deadline {
            guard poll(&poller, 1, 200) > 0 else { continue }
            let count = read(outputPipe[0], &buffer, buffer.count)
            if count <= 0 { break }
            bytes += buffer[0..<count]
        }
        close(outputPipe[0])
        if Date() >= deadline { kill(child.pid, SIGKILL) }
        return (child.wait(), String(decoding: bytes, as: UTF8.self))
    }

    /// Waits for the child and returns its exit status (128 + signal when killed).
    @discardableResult
    func wait() -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        let signal = status & 0x7F
        return signal == 0 ? (status >> 8) & 0xFF : 128 + signal
    }

    /// Whether the child has exited (reaping it if so).
    func hasExited() -> Bool {
        var status: Int32 = 0
        return waitpid(pid, &status, WNOHANG) == pid
    }
}
