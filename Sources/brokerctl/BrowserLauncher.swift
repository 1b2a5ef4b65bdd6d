import CSpawn

#if canImport(Glibc)
import Glibc
#endif

/// `xdg-open URL`, started with posix_spawn (found on `PATH`, no shell): standard input and
/// output on /dev/null, so nothing the browser prints reaches brokerctl's output, and in a
/// process group of its own, so Ctrl-C at brokerctl's terminal does not reach it (nor a
/// browser it starts); it inherits no other descriptor. Reaped with `reap()`.
struct BrowserLauncher {
    let pid: pid_t

    /// Starts `xdg-open url`; the failure is the reason, for the user.
    static func open(_ url: String) -> Result<BrowserLauncher, BrowserFailure> {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (descriptor, flags) in [(Int32(0), O_RDONLY), (1, O_WRONLY), (2, O_WRONLY)] {
            posix_spawn_file_actions_addopen(&actions, descriptor, "/dev/null", flags, 0)
        }
        // brokerctl's other descriptors (the broker socket among them) stay out of the browser.
        guard tokenbroker_spawn_close_from(&actions, 3) == 0 else {
            return .failure(BrowserFailure(reason: "cannot arrange for its descriptors to be closed"))
        }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGINT)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF))
        let words = ["xdg-open", url]
        let argv = words.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let result = posix_spawnp(&pid, "xdg-open", &actions, &attributes, argv, environ)
        guard result == 0 else { return .failure(BrowserFailure(reason: String(cString: strerror(result)))) }
        return .success(BrowserLauncher(pid: pid))
    }

    /// Collects xdg-open's exit status if it has ended; `true` once it has.
    @discardableResult
    func reap() -> Bool {
        var status: Int32 = 0
        let result = waitpid(pid, &status, WNOHANG)
        return result == pid || (result < 0 && errno == ECHILD)
    }
}

/// Why xdg-open could not be started.
struct BrowserFailure: Error, CustomStringConvertible {
    var reason: String
    var description: String { reason }
}
