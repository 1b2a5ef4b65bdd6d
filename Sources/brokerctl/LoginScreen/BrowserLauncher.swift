import ProcessSpawn

#if canImport(Glibc)
import Glibc
#endif

/// `xdg-open URL`, started with `ProcessSpawn` (found on `PATH`, no shell): standard input and
/// output on /dev/null, so nothing the browser prints reaches brokerctl's output, and in a
/// process group of its own, so Ctrl-C at brokerctl's terminal does not reach it (nor a
/// browser it starts); it inherits no other descriptor (the broker socket among them). Reaped
/// with `reap()`.
struct BrowserLauncher {
    let pid: pid_t

    /// Starts `xdg-open url`; the failure is the reason, for the user.
    static func open(_ url: String) -> Result<BrowserLauncher, BrowserFailure> {
        var spawn = ProcessSpawn()
        spawn.defaultSignals = [SIGINT]
        spawn.ownProcessGroup = true
        spawn.searchesPath = true
        return spawn.start(["xdg-open", url], environment: ProcessSpawn.inheritedEnvironment)
            .map { BrowserLauncher(pid: $0) }.mapError { BrowserFailure(reason: $0.description) }
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
