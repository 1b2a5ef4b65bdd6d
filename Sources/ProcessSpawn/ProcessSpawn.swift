import CSpawn

#if canImport(Glibc)
import Glibc
#endif

/// How every child process of tokenbroker starts: brokerd's `exec` provider, brokerctl's
/// browser and `exec` bridge, and the test support's children. One place, so that each gets
/// the same guarantees: `posix_spawn` (no shell), no descriptor of the parent's but the three
/// standard ones, even those not opened close-on-exec (NIO's sockets, the broker's listener
/// and connections); no blocked signal (a Swift concurrency thread blocks most, and a child
/// would inherit the mask and then ignore SIGTERM); the signals named reset to their defaults;
/// a process group of its own when asked, so that a timeout or Ctrl-C reaches what the child
/// starts, or does not. The caller reaps the child with `waitpid`.
///
/// Not Foundation's `Process`: on Linux it learns of a child's exit through a descriptor every
/// grandchild inherits, so a helper that leaves a background process behind looks alive. Not
/// swift-subprocess: its API is asynchronous and owns the waiting, where brokerctl's `exec`
/// bridge waits for its child synchronously while it forwards signals, and the `exec` provider
/// bounds its wait by time and output and then stops the child's whole process group.
public struct ProcessSpawn: Sendable {
    /// Where one of the child's standard descriptors (0, 1, 2) comes from.
    public enum Stream: Sendable {
        /// `/dev/null`, opened for reading (standard input) or writing (output, error).
        case devNull
        /// The parent's own descriptor of that number.
        case inherited
        /// A copy of this descriptor of the parent's.
        case descriptor(Int32)
    }

    public var standardInput = Stream.devNull
    public var standardOutput = Stream.devNull
    public var standardError = Stream.devNull
    /// The signals whose disposition is reset to the default in the child (an ignored signal
    /// stays ignored across `exec` otherwise); `nil`: every signal.
    public var defaultSignals: [Int32]?
    /// Whether the child leads a process group of its own.
    public var ownProcessGroup = false
    /// Whether a command without a slash is looked up on `PATH` (`posix_spawnp`).
    public var searchesPath = false

    public init() {}

    /// Starts `arguments[0]` with `arguments` as its argv and `environment` (`NAME=value`
    /// entries) as its whole environment; its process id, or why it could not start.
    public func start(_ arguments: [String], environment: [String]) -> Result<pid_t, SpawnFailure> {
        guard let command = arguments.first else { return .failure(SpawnFailure(code: EINVAL)) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (target, stream) in [(Int32(0), standardInput), (1, standardOutput), (2, standardError)] {
            switch stream {
            case .devNull:
                posix_spawn_file_actions_addopen(&actions, target, "/dev/null", target == 0 ? O_RDONLY : O_WRONLY, 0)
            case .inherited: break
            case .descriptor(let source): posix_spawn_file_actions_adddup2(&actions, source, target)
            }
        }
        // After the dup2s, which read their sources.
        let closing = tokenbroker_spawn_close_from(&actions, 3)
        guard closing == 0 else { return .failure(SpawnFailure(code: closing)) }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var defaults = sigset_t()
        if let defaultSignals {
            sigemptyset(&defaults)
            for signal in defaultSignals { sigaddset(&defaults, signal) }
        } else {
            sigfillset(&defaults)
        }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF
        if ownProcessGroup {
            posix_spawnattr_setpgroup(&attributes, 0)
            flags |= POSIX_SPAWN_SETPGROUP
        }
        posix_spawnattr_setflags(&attributes, Int16(flags))

        let argv = arguments.map { strdup($0) } + [nil]
        let envp = environment.map { strdup($0) } + [nil]
        defer { (argv + envp).forEach { free($0) } }
        var pid: pid_t = 0
        let result =
            searchesPath
            ? posix_spawnp(&pid, command, &actions, &attributes, argv, envp)
            : posix_spawn(&pid, command, &actions, &attributes, argv, envp)
        guard result == 0 else { return .failure(SpawnFailure(code: result)) }
        return .success(pid)
    }

    /// This process's environment, as `NAME=value` entries.
    public static var inheritedEnvironment: [String] {
        var entries: [String] = []
        var index = 0
        while let entry = environ[index] {
            entries.append(String(cString: entry))
            index += 1
        }
        return entries
    }
}

/// Why a child could not be started: the error number `posix_spawn` gave.
public struct SpawnFailure: Error, CustomStringConvertible, Sendable {
    public let code: Int32
    public var description: String { String(cString: strerror(code)) }
}
