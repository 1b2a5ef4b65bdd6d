import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A brokerctl process running in the background against a `BrokerProcess` (a `login` that
/// waits for the user), its stdout and stderr collected in files, so the test can read what it
/// shows while it waits and then play the user. Always waited for (`finish`, or on deinit).
final class BackgroundBrokerctl {
    let child: ChildProcess
    private let directory: TemporaryDirectory

    /// Starts `brokerctl arguments` (or `program arguments`) with `stdin` on a pipe (or
    /// /dev/null), in the broker's environment without a display or an SSH session, plus `environment`.
    init(
        _ broker: BrokerProcess, _ arguments: [String], program: String = BrokerProcess.binary("brokerctl").path,
        stdin: String? = nil, environment: [String: String] = [:]
    ) throws {
        directory = try TemporaryDirectory()
        var variables = broker.environment
        for name in ["DISPLAY", "WAYLAND_DISPLAY", "SSH_CONNECTION"] { variables[name] = nil }
        variables["TOKENBROKER_SOCKET"] = broker.socketPath
        variables.merge(environment) { $1 }
        let output = open(directory.file("stdout"), O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        let errors = open(directory.file("stderr"), O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        defer {
            close(output)
            close(errors)
        }
        var input: Int32?
        if let stdin {
            var ends: [Int32] = [-1, -1]
            guard pipe(&ends) == 0 else { throw HarnessError("pipe failed: errno \(errno)") }
            for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
            _ = Array(stdin.utf8).withUnsafeBytes { write(ends[1], $0.baseAddress, $0.count) }
            close(ends[1])
            input = ends[0]
        }
        defer { if let input { close(input) } }
        child = try ChildProcess.spawn(
            program, arguments, environment: variables, input: input, output: output, errors: errors)
    }

    deinit {
        if !child.hasExited() { kill(child.pid, SIGKILL) }
        child.wait()
        directory.remove()
    }

    var stdout: String { (try? String(contentsOfFile: directory.file("stdout"), encoding: .utf8)) ?? "" }
    var stderr: String { (try? String(contentsOfFile: directory.file("stderr"), encoding: .utf8)) ?? "" }

    /// The stdout lines decoded as JSON objects.
    var jsonLines: [[String: Any]] {
        stdout.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// Waits until `find` gets a value from what the process has shown so far; throws with its
    /// output if it exits or 20 s pass first.
    func waitFor<T>(_ what: String, _ find: (BackgroundBrokerctl) -> T?) async throws -> T {
        _ = await eventually(timeout: 20) { find(self) != nil || child.hasExited() }
        if let value = find(self) { return value }
        throw HarnessError("brokerctl never showed \(what); stdout: \(stdout) stderr: \(stderr)")
    }

    /// Human output: the verification link with the code filled in.
    func deviceLink() async throws -> String {
        try await waitFor("the device link") { process in
            process.stderr.split(separator: "\n").first { $0.hasPrefix(Self.deviceLinkPrefix) }
                .map { String($0.dropFirst(Self.deviceLinkPrefix.count)) }
        }
    }

    static let deviceLinkPrefix = "Or open this link, which fills the code in: "

    /// `--json` output: the first object whose `event` is `event`.
    func jsonEvent(_ event: String) async throws -> [String: Any] {
        try await waitFor("a \(event) line") { process in process.jsonLines.first { $0["event"] as? String == event } }
    }

    /// Waits for the exit (SIGKILL after `timeout` seconds) and returns the status.
    func finish(timeout: TimeInterval = 60) async -> Int32 {
        if !(await eventually(timeout: timeout) { child.hasExited() }) { kill(child.pid, SIGKILL) }
        return child.wait()
    }
}

/// A tmux server of the test's own (`-D`: in the foreground, so it is the test's child and is
/// waited for), with its socket in a temporary directory: a real terminal for brokerctl.
final class TmuxTerminal {
    private let directory: TemporaryDirectory
    private let server: ChildProcess
    private let environment: [String: String]
    private var socket: String { directory.file("tmux.sock") }

    init(environment: [String: String]) async throws {
        directory = try TemporaryDirectory()
        self.environment = environment
        server = try ChildProcess.spawn(
            "/usr/bin/tmux", ["-D", "-f", "/dev/null", "-S", directory.file("tmux.sock")], environment: environment)
        let socket = directory.file("tmux.sock")
        let server = self.server
        guard
            await eventually(timeout: 10, { FileManager.default.fileExists(atPath: socket) || server.hasExited() }),
            !server.hasExited()
        else { throw HarnessError("tmux did not start") }
        // A pane whose command ended stays, so the test can read what it left.
        try command(["set-option", "-g", "remain-on-exit", "on"])
    }

    deinit {
        _ = try? command(["kill-server"])
        server.stop()
        directory.remove()
    }

    /// Runs `tmux -S SOCKET arguments`; returns its output, throwing if it fails.
    @discardableResult
    func command(_ arguments: [String]) throws -> String {
        let result = try ChildProcess.capture(
            "/usr/bin/tmux", ["-S", socket] + arguments, environment: environment, timeout: 20)
        guard result.status == 0 else { throw HarnessError("tmux \(arguments) failed: \(result.stderr)") }
        return result.stdout
    }

    /// Starts a window running `argv` (each word quoted for the shell tmux runs it with); its
    /// exit status goes to a file `exitStatus` reads.
    func run(_ argv: [String]) throws {
        let line = argv.map { "'" + $0.replacingOccurrences(of: "'", with: #"'\''"#) + "'" }.joined(separator: " ")
        try command([
            "new-session", "-d", "-s", "test", "-x", "250", "-y", "50",
            "\(line); echo $? > \(directory.file("status"))",
        ])
    }

    /// The visible screen, wrapped lines joined.
    func screen() throws -> [String] {
        try command(["capture-pane", "-p", "-J", "-t", "test"]).components(separatedBy: "\n")
    }

    /// Presses `key` (tmux key name, e.g. `C-c`).
    func press(_ key: String) throws { try command(["send-keys", "-t", "test", key]) }

    /// The command's exit status once it has ended.
    var exitStatus: Int32? {
        (try? String(contentsOfFile: directory.file("status"), encoding: .utf8))
            .flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// Waits until the screen satisfies `condition`; throws with the screen after 20 s.
    @discardableResult
    func waitForScreen(_ what: String, _ condition: ([String]) -> Bool) async throws -> [String] {
        var lines: [String] = []
        let shown = try await eventually(timeout: 20) {
            lines = try screen()
            return condition(lines)
        }
        if shown { return lines }
        throw HarnessError("the terminal never showed \(what): \(try screen().joined(separator: "\n"))")
    }
}

/// The value of query parameter `name` in `url`.
func queryValue(_ name: String, in url: String) -> String? {
    URLComponents(string: url)?.queryItems?.first { $0.name == name }?.value
}
