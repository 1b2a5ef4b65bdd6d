import ArgumentParser
import BrokerClient
import BrokerProtocol
import CSpawn
import ProcessSpawn
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// `brokerctl exec ACCOUNT [--env VAR] -- CMD ARGS...`: runs CMD (found on PATH, no shell) with
/// the token in `VAR` and `BEARER_TOKEN_FILE` naming a 0600 file that brokerctl keeps fresh
/// while CMD runs and removes when it ends.
///
/// brokerctl, not brokerd, keeps the file: it is the process that knows when CMD ends (it waits
/// for it) and it is there to remove the file on every way out; it writes where CMD runs, which
/// brokerd may not see (a container that has only the socket); and it asks for the token as
/// any client does, so the account's access rules apply to it unchanged.
///
/// It follows the broker: a thread subscribes to the account's events and, at each `refreshed`
/// or `valid`, has the file rewritten with the broker's new token, since an IdP may revoke the
/// old one when it rotates the refresh token (docs/bridges.md, "Any command"). Its own timer stays, for
/// the time the events are lost.
struct Exec: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "exec",
        abstract:
            "Run a command with the account's token in $BEARER_TOKEN and a file kept fresh in $BEARER_TOKEN_FILE.",
        discussion: """
            The file (0600, in a new 0700 directory under $XDG_RUNTIME_DIR, else /tmp; never in the \
            socket's directory) is rewritten as soon as the broker refreshes the account (brokerctl \
            follows its events, and subscribes again when the broker restarts) and before each \
            expiry, for as long as the command runs, and removed with its directory when it ends; \
            read it for each request in a long job ($BEARER_TOKEN keeps the first token). A failure \
            to renew it is told once, and once more when renewing works again. SIGINT, SIGTERM, \
            SIGHUP and SIGQUIT are passed on to the command. The exit code is the command's (128 + the signal when it was killed).
            """)

    /// The variable naming the token file.
    static let fileVariable = "BEARER_TOKEN_FILE"
    /// The signals passed on to the command.
    static let forwarded = [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
    /// `si_code` of a signal the kernel sent (SI_KERNEL), e.g. for a key pressed on the terminal.
    static let sentByKernel: Int32 = 0x80
    /// The signal the event thread sends the main thread when the broker has a new token.
    static let followSignal = SIGUSR1

    @OptionGroup var options: BridgeOptions
    @OptionGroup var narrowing: Narrowing
    @Option(help: "The environment variable that holds the token.") var env = "BEARER_TOKEN"
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @Argument(parsing: .postTerminator, help: "The command and its arguments, after --.") var command: [String] = []

    func validate() throws {
        guard !command.isEmpty else { throw ValidationError("give the command after --") }
        let bytes = Array(env.utf8)
        guard (1...255).contains(bytes.count), !(0x30...0x39).contains(bytes[0]),
            bytes.allSatisfy({ $0 == UInt8(ascii: "_") || isalnum(Int32($0)) != 0 }), env != Self.fileVariable
        else {
            throw ValidationError(
                "--env must be a variable name (letters, digits and _) other than \(Self.fileVariable)")
        }
    }

    func run() throws {
        let first = try GlobalOptions.reportingFailures { try options.token(of: account, narrowing: narrowing) }
        let file = try TokenFile(inNewDirectoryUnder: tokenDirectoryBase(), token: first.accessToken)
        defer { file.remove() }
        var signals = sigset_t()
        sigemptyset(&signals)
        for signal in Self.forwarded + [SIGCHLD, Self.followSignal] { sigaddset(&signals, signal) }
        // Blocked here (and in the event thread, which inherits the mask) and taken with
        // sigtimedwait below; the command starts with none blocked.
        pthread_sigmask(SIG_BLOCK, &signals, nil)
        try followEvents()
        let child: pid_t
        do {
            child = try spawn(environment: [env: first.accessToken, Self.fileVariable: file.path])
        } catch {
            StandardStream.error.write("brokerctl: cannot run \(command[0]): \(error)\n")
            throw ExitCode(error.code == ENOENT ? .commandNotFound : .cannotRun)
        }
        var renewal = Renewal(token: first, minTTL: options.minTTL, now: Date())
        var outage = OutageReport()
        while true {
            var info = siginfo_t()
            var wait = Self.waitTime(renewal.nextAt.timeIntervalSinceNow)
            let signal = sigtimedwait(&signals, &info, &wait)
            if signal == SIGCHLD || (signal < 0 && errno == EINTR) {
                if let code = Self.exitCode(of: child) { throw ExitCode(code) }
            } else if signal == Self.followSignal {
                renew(&renewal, file: file, outage: &outage, following: true)
            } else if signal > 0 {
                // A signal the terminal sent went to CMD's process group already.
                if info.si_code != Self.sentByKernel { kill(child, signal) }
            } else {
                renew(&renewal, file: file, outage: &outage, following: false)
            }
        }
    }

    /// Starts the thread that follows the account's events: at each `refreshed` or `valid`, and
    /// after each (re)subscription (a refresh may have come before it), it sends `followSignal`
    /// to this thread.
    private func followEvents() throws {
        let main = pthread_self()
        let account = account
        let follower = EventFollower(
            client: try options.client(), accounts: [account],
            lost: {
                "lost the broker's events for \(account) (\($0)); renewing the token file on a timer until they come back"
            },
            back: "following the broker's events for \(account) again")
        let started = OwnThread.start {
            do {
                try follower.run(subscribed: { pthread_kill(main, Self.followSignal) }) { event in
                    if [.refreshed, .valid].contains(event.event) { pthread_kill(main, Self.followSignal) }
                }
            } catch {
                let reason = (error as? BrokerError)?.message ?? "\(error)"
                StandardStream.error.write(
                    "brokerctl: cannot follow the events of \(account): \(reason); renewing the token file on a timer\n"
                )
            }
        }
        guard started == 0 else { throw BridgeFailure("cannot start a thread: \(String(cString: strerror(started)))") }
    }

    /// Writes the broker's token when it differs from the one in the file: its current one when
    /// `following` an event, else one that outlives the file's. A failure is told once per
    /// outage (`OutageReport`) and tried again later (the file keeps the last token until then).
    private func renew(_ renewal: inout Renewal, file: TokenFile, outage: inout OutageReport, following: Bool) {
        do {
            let minTTL = following ? options.minTTL ?? 0 : renewal.minTTLForNext(now: Date())
            let token = try options.client().perform(
                .token(account: account, minTTL: minTTL, scope: narrowing.scope, resource: narrowing.resource))
            // An account that became DPoP-bound meanwhile: its token is useless in the file.
            guard !TokenType.isDPoP(token.tokenType) else { throw BridgeFailure.dpopBound(account) }
            if token.accessToken != renewal.token.accessToken { try file.replace(with: token.accessToken) }
            renewal.took(token, now: Date(), following: following)
            outage.succeeded("renewed the token of \(account) again")
        } catch {
            let reason = (error as? BrokerError)?.message ?? "\(error)"
            outage.failed("cannot renew the token of \(account): \(reason); trying again until it works")
            renewal.failed(now: Date())
        }
    }

    /// Starts the command with this process's environment plus `extra`, no descriptor but 0 to 2,
    /// and the default disposition and no mask for the signals blocked here.
    private func spawn(environment extra: [String: String]) throws(SpawnFailure) -> pid_t {
        var spawn = ProcessSpawn()
        spawn.standardInput = .inherited
        spawn.standardOutput = .inherited
        spawn.standardError = .inherited
        spawn.defaultSignals = Self.forwarded + [SIGCHLD, SIGPIPE]
        spawn.searchesPath = true
        let names = Set(extra.keys.map { $0 + "=" })
        let entries =
            ProcessSpawn.inheritedEnvironment.filter { entry in !names.contains(where: entry.hasPrefix) }
            + extra.map { "\($0.key)=\($0.value)" }
        return try spawn.start(command, environment: entries).get()
    }

    /// The exit code of `child` once it has ended (128 + the signal that killed it); `nil` while it runs.
    private static func exitCode(of child: pid_t) -> Int32? {
        var status: Int32 = 0
        guard waitpid(child, &status, WNOHANG) == child else { return nil }
        let signal = status & 0x7F
        return signal == 0 ? (status >> 8) & 0xFF : 128 + signal
    }

    /// Where the token file's own directory is made: the user's runtime directory, else /tmp
    /// (`mkdtemp` makes a name there no one could take first), whichever is neither the
    /// socket's directory nor inside it: docs/bridges.md says to bind-mount that directory into
    /// containers, which must not see the token files of every job.
    private func tokenDirectoryBase() throws -> String {
        let paths = DefaultPaths()
        let sockets = [options.socket ?? paths.socket, paths.ignoringSocketVariable.socket]
        let socketDirectories = sockets.map { socket in
            Self.resolved(socket.lastIndex(of: "/").map { String(socket[..<$0]) } ?? ".")
        }
        let candidates = [paths.runtimeDirectory, "/tmp"].compactMap { $0 }
        let base = candidates.first { candidate in
            let place = Self.resolved(candidate)
            return !socketDirectories.contains { place == $0 || place.hasPrefix($0 == "/" ? "/" : $0 + "/") }
        }
        guard let base else {
            throw BridgeFailure(
                "no directory for the token file outside the socket's directory (\(candidates.joined(separator: ", ")) "
                    + "are in it); set XDG_RUNTIME_DIR to another one")
        }
        return base
    }

    /// `path` with symbolic links, `.` and `..` resolved, when it exists; else as it is.
    private static func resolved(_ path: String) -> String {
        guard let real = realpath(path.isEmpty ? "/" : path, nil) else { return path }
        defer { free(real) }
        return String(cString: real)
    }

    /// `seconds` (at least a millisecond, at most a day) as a timespec.
    private static func waitTime(_ seconds: TimeInterval) -> Glibc.timespec {
        let wait = seconds.isFinite ? min(max(seconds, 0.001), 86_400) : 86_400
        return Glibc.timespec(tv_sec: Int(wait), tv_nsec: Int((wait - wait.rounded(.down)) * 1e9))
    }
}

/// When the token in the file is due: when less than `max(min_ttl, a third of the lifetime it
/// had when it was taken)` remains, a token that lives longer is asked for.
struct Renewal {
    private(set) var token: TokenResult
    let minTTL: Double?
    /// When to ask next.
    private(set) var nextAt: Date

    init(token: TokenResult, minTTL: Double?, now: Date) {
        self.token = token
        self.minTTL = minTTL
        nextAt = Self.due(token, minTTL: minTTL, now: now)
    }

    /// The broker answered `token` at `now`: the next one is due before it expires, or, when
    /// it is the token already held, as planned when `following` an event (the broker has none
    /// newer) and else soon (it could give none fresher).
    mutating func took(_ token: TokenResult, now: Date, following: Bool = false) {
        guard token.accessToken != self.token.accessToken else { return following ? () : failed(now: now) }
        self.token = token
        nextAt = Self.due(token, minTTL: minTTL, now: now)
    }

    /// Asking failed at `now`: try again soon.
    mutating func failed(now: Date) {
        nextAt = now.addingTimeInterval(Self.retryDelay(token.expiresAt.timeIntervalSince(now)))
    }

    /// The `min_ttl` that makes the broker answer a token living longer than the current one.
    func minTTLForNext(now: Date) -> Double {
        let remaining = max(0, token.expiresAt.timeIntervalSince(now))
        return min(max(minTTL ?? 0, remaining + 1), Bounds.maximumLifetime)
    }

    private static func due(_ token: TokenResult, minTTL: Double?, now: Date) -> Date {
        let lifetime = token.expiresAt.timeIntervalSince(now)
        let due = token.expiresAt.addingTimeInterval(-max(minTTL ?? 0, lifetime / 3))
        return due > now ? due : now.addingTimeInterval(retryDelay(lifetime))
    }

    /// A quarter of what remains, from half a second to 30 seconds.
    private static func retryDelay(_ remaining: TimeInterval) -> TimeInterval {
        min(max(remaining / 4, 0.5), 30)
    }
}
