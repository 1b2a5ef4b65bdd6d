import BrokerModel
import BrokerProtocol
import BrokerSecrets
import Dispatch
import FoundationEssentials
import Logging
import NIOPosix
import ProcessSpawn

#if canImport(Glibc)
import Glibc
#endif

/// Settings of an `exec` account.
public struct ExecSettings: Codable, Sendable, Equatable {
    /// The argv to run, without a shell; `command[0]` is an absolute path to an executable.
    public var command: [String]
}

extension ExecSettings: ProviderSettings {
    package static let kind = "exec"
    package static let fields = [ProviderField(name: "command", type: .texts)]
    package static let renewal = Renewal.refreshes

    /// The command holds the credential: it signs in with its own tool, then is asked again.
    package func restoration(discovered: DiscoveredEndpoints?) -> Restoration { .askCommandAgain }

    /// A non-empty argv without NUL whose first element is an absolute path to an executable file.
    package init(checking fields: ProviderFields) throws(BrokerFailure) {
        guard let command = try fields.texts("command"), let path = command.first else {
            throw .invalid("an exec provider needs \"command\", a non-empty array of strings")
        }
        guard !command.contains(where: { $0.utf8.contains(0) }) else {
            throw .invalid("\"command\" arguments must not contain NUL characters")
        }
        guard path.hasPrefix("/") else {
            throw .invalid("command[0] must be an absolute path (the command runs without a shell)")
        }
        var isDirectory = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory,
            FileManager.default.isExecutableFile(atPath: path)
        else {
            throw .invalid("command[0] \(InputEcho.printable(path)) is not an executable file")
        }
        self.command = command
    }

    package func makeProvider(_ context: ProviderContext) -> any TokenProvider {
        ExecProvider(
            settings: self, timeout: context.settings.requestTimeout, defaultLifetime: context.settings.defaultLifetime,
            logger: context.logger)
    }
}

/// `exec` accounts: a configured command prints a JSON token set, like AWS's `credential_process`.
///
/// The command runs directly (no shell) with stdin on `/dev/null`, a timeout, and stdout capped at
/// 1 MiB. Exit 0 with a usable token is success; exit 2, or `"error": "denied"` / `"invalid_grant"`,
/// is a denial; anything else (another exit code, a signal, a timeout, bad JSON) is transient.
/// Its stderr goes to the broker's log (one truncated line, the account's secrets and the tokens
/// it printed redacted), never into a message for clients.
package struct ExecProvider: TokenProvider {
    package let settings: ExecSettings
    package let timeout: TimeInterval
    package let defaultLifetime: TimeInterval
    package let logger: Logger

    package func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        let output = await ExecRunner.run(settings.command, timeout: timeout)
        // A helper tracing itself (`set -x`) prints the tokens it is about to hand over.
        let printed = JSONValue.object(decoding: output.stdout)
        let hidden = ["access_token", "id_token", "refresh_token"].map { printed?[$0]?.text }
        if let line = record.outsideText(alsoHiding: hidden).clean(String(decoding: output.stderr, as: UTF8.self)) {
            logger.notice(
                "exec provider wrote to stderr", metadata: ["account": "\(record.name)", "stderr": "\(line)"])
        }
        // Lifetimes count from the start of the run: a little early, never late. An error it
        // printed may quote the tokens it printed too.
        return Self.interpret(output, now: now, defaultLifetime: defaultLifetime, timeout: timeout)
            .mapError(record.outsideText(alsoHiding: hidden).clean)
    }

    /// Denials a command can state in its JSON instead of (or as well as) exiting with 2.
    package static let denialErrors: Set<String> = ["denied", "invalid_grant"]

    /// Classifies a finished (or abandoned) run.
    package static func interpret(_ output: ExecOutput, now: Date, defaultLifetime: TimeInterval, timeout: TimeInterval)
        -> Result<Grant, RefreshFailure>
    {
        let object = JSONValue.object(decoding: output.stdout)
        let error = object?["error"]?.text
        switch output.ending {
        case .launchFailed(let reason):
            return .failure(.transient("cannot start the command: \(reason)"))
        case .timedOut:
            return .failure(
                .transient("the command did not finish within \(Bounds.wholeSeconds(timeout.rounded(.up))) s"))
        case .outputTooLarge:
            return .failure(.transient("the command printed more than 1 MiB"))
        case .signalled(let signal):
            return .failure(.transient("the command was killed by signal \(signal)"))
        case .exited(let status):
            if status == 2 || error.map(denialErrors.contains) == true {
                let detail = error.map { " (\($0))" } ?? " (exit status \(status))"
                return .failure(.denial("the command denied the refresh\(detail)"))
            }
            guard status == 0 else { return .failure(.transient("the command exited with status \(status)")) }
            if let error { return .failure(.transient("the command reported an error (\(error))")) }
            return TokenDocument.read(
                object, issuedAt: now, defaultLifetime: defaultLifetime, source: "the command's output"
            ).map { Grant(token: $0) }
        }
    }
}

/// What one run of a command produced.
package struct ExecOutput: Sendable, Equatable {
    /// How the run ended.
    package enum Ending: Sendable, Equatable {
        case exited(Int32)
        case signalled(Int32)
        /// Still running at the deadline: it was killed (and waited for).
        case timedOut
        /// Printed more than the stdout cap: it was killed (and waited for).
        case outputTooLarge
        case launchFailed(String)
    }

    package var ending: Ending
    package var stdout = Data()
    package var stderr = Data()
    /// The child's process id (for tests that check it was reaped).
    package var pid: Int32?
}

/// Runs a command without a shell, bounded in time and output, and always waits for it.
///
/// It starts the command with `ProcessSpawn` and waits with `waitpid`, so a helper that leaves a
/// background process behind cannot hold the refresh past its bounds. The child gets default
/// signal dispositions and an empty signal mask (the broker ignores SIGPIPE and traps SIGTERM),
/// a process group of its own, so a timeout stops its children too, no descriptor but stdin,
/// stdout and stderr, and the broker's environment without the variables systemd meant for the
/// broker alone.
package enum ExecRunner {
    /// Largest stdout accepted.
    package static let stdoutLimit = 1 << 20
    /// stderr kept for the log; the rest is read and dropped so the child never blocks on it.
    package static let stderrLimit = 16 << 10
    /// After the child exits, how long its stdout and stderr may stay open (held by a grandchild).
    package static let drainGrace: Duration = .milliseconds(500)
    /// After SIGTERM, how long the child has before SIGKILL.
    package static let killGrace: Duration = .seconds(1)

    /// Runs `command` on a thread of NIO's blocking pool (it blocks), off the event loops that
    /// run brokerd's tasks.
    package static func run(_ command: [String], timeout: TimeInterval) async -> ExecOutput {
        do {
            return try await NIOThreadPool.singleton.runIfActive { runBlocking(command, timeout: timeout) }
        } catch {
            return ExecOutput(ending: .launchFailed("the broker is shutting down"))
        }
    }

    /// Waits for children that even SIGKILL could not end at once. A serial queue of its own:
    /// libdispatch's global queues would arm its once-a-second workqueue monitor in brokerd
    /// (see `EventLoopSleep`), and a thread of NIO's pool held here would be one less for work.
    private static let lateReaper = DispatchQueue(label: "tokenbroker.exec.late-reaper")

    package static func runBlocking(_ command: [String], timeout: TimeInterval) -> ExecOutput {
        guard !command.isEmpty else { return ExecOutput(ending: .launchFailed("the command is empty")) }
        guard let stdoutPipe = makePipe() else { return ExecOutput(ending: .launchFailed("no pipe")) }
        guard let stderrPipe = makePipe() else {
            close(stdoutPipe[0])
            close(stdoutPipe[1])
            return ExecOutput(ending: .launchFailed("no pipe"))
        }
        defer {
            close(stdoutPipe[0])
            close(stderrPipe[0])
        }
        let spawned = spawn(command, stdout: stdoutPipe[1], stderr: stderrPipe[1])
        close(stdoutPipe[1])
        close(stderrPipe[1])
        let pid: pid_t
        switch spawned {
        case .success(let value): pid = value
        case .failure(let failure): return ExecOutput(ending: .launchFailed("\(command[0]): \(failure)"))
        }
        var output = ExecOutput(ending: .timedOut, pid: pid)

        let clock = ContinuousClock()
        let deadline = clock.now + .milliseconds(Bounds.milliseconds(max(0, timeout)))
        var status: Int32?
        var exitedAt: ContinuousClock.Instant?
        var streams = [(fd: stdoutPipe[0], open: true), (fd: stderrPipe[0], open: true)]
        var abandon: ExecOutput.Ending?
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let now = clock.now
            if status == nil { status = reap(pid, block: false) }
            if status != nil {
                if !streams.contains(where: \.open) { break }
                exitedAt = exitedAt ?? now
                if now - exitedAt! >= drainGrace { break }
            }
            if now >= deadline {
                if status == nil { abandon = .timedOut }
                break
            }
            guard streams.contains(where: \.open) else {
                usleep(10_000)
                continue
            }
            var fds = streams.filter(\.open).map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
            guard poll(&fds, nfds_t(fds.count), 50) > 0 else { continue }  // a timeout, or EINTR
            for polled in fds where polled.revents != 0 {
                let count = read(polled.fd, &buffer, buffer.count)
                if count < 0, errno == EINTR || errno == EAGAIN { continue }
                let index = streams.firstIndex { $0.fd == polled.fd }!
                if count <= 0 {
                    streams[index].open = false
                } else if index == 0 {
                    output.stdout.append(contentsOf: buffer[0..<count])
                } else if output.stderr.count < stderrLimit {
                    output.stderr.append(contentsOf: buffer[0..<min(count, stderrLimit - output.stderr.count)])
                }
            }
            if output.stdout.count > stdoutLimit {
                abandon = .outputTooLarge
                break
            }
        }

        if let abandon {
            stop(pid, reaped: &status)
            output.ending = abandon
        } else if let status {
            output.ending = ending(status)
        }
        return output
    }

    /// SIGTERM to the child's process group, SIGKILL after `killGrace`, then waits for the child.
    /// A child that even SIGKILL cannot end at once (stuck in the kernel) is waited for in the
    /// background, so the caller is never held.
    private static func stop(_ pid: pid_t, reaped status: inout Int32?) {
        let target = -pid  // the child leads its own process group
        kill(target, SIGTERM)
        let clock = ContinuousClock()
        let killAt = clock.now + killGrace
        while status == nil, clock.now < killAt {
            usleep(10_000)
            status = reap(pid, block: false)
        }
        kill(target, SIGKILL)
        let giveUpAt = clock.now + .seconds(5)
        while status == nil, clock.now < giveUpAt {
            usleep(10_000)
            status = reap(pid, block: false)
        }
        if status == nil {
            lateReaper.async { _ = reap(pid, block: true) }
        }
    }

    /// A pipe whose ends are closed on exec (the child gets copies as fd 1 and 2). Glibc's
    /// `pipe2` is not visible to Swift; the short window before `FD_CLOEXEC` only matters to
    /// another command spawned at that instant, which would hold the pipe open until it exits.
    private static func makePipe() -> [Int32]? {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { return nil }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        return fds
    }

    /// `waitpid` for `pid`: its wait status once it has ended (and is reaped), `nil` while it runs.
    private static func reap(_ pid: pid_t, block: Bool) -> Int32? {
        var status: Int32 = 0
        while true {
            let result = waitpid(pid, &status, block ? 0 : WNOHANG)
            if result == pid { return status }
            if result == 0 { return nil }
            if errno == EINTR { continue }
            return 255 << 8  // ECHILD: already reaped elsewhere; report a failed exit
        }
    }

    /// How a wait status ended: exit code or signal (`WIFEXITED`/`WTERMSIG`, which Swift cannot import).
    package static func ending(_ status: Int32) -> ExecOutput.Ending {
        let signal = status & 0x7f
        return signal == 0 ? .exited((status >> 8) & 0xff) : .signalled(signal)
    }

    /// Variables that systemd gives the broker itself; a command must not act on them (notify
    /// systemd for the broker, take its sockets, find its vault key).
    package static let brokerOnlyVariables: Set<String> = [
        "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
        "CREDENTIALS_DIRECTORY",
    ]

    /// The command's environment: the broker's, minus `brokerOnlyVariables`, as `NAME=value`.
    package static func childEnvironment(_ environment: [String: String]) -> [String] {
        environment.filter { !brokerOnlyVariables.contains($0.key) }.map { "\($0.key)=\($0.value)" }.sorted()
    }

    /// Starts `command[0]` directly with stdin on /dev/null and the given stdout and stderr, in
    /// a process group of its own, with nothing else of the broker's: not its listening socket,
    /// client connections, IdP connections or event-loop descriptors.
    private static func spawn(_ command: [String], stdout: Int32, stderr: Int32) -> Result<pid_t, SpawnFailure> {
        var spawn = ProcessSpawn()
        spawn.standardOutput = .descriptor(stdout)
        spawn.standardError = .descriptor(stderr)
        spawn.ownProcessGroup = true
        return spawn.start(command, environment: childEnvironment(ProcessInfo.processInfo.environment))
    }
}
