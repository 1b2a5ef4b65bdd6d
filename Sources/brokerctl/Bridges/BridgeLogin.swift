import ArgumentParser
import BrokerClient
import BrokerProtocol

#if canImport(Glibc)
import Glibc
#endif

/// A bridge's sign-in: when the account a tool asks for needs a login and someone is there to
/// sign in, the bridge starts the account's login, or joins the one running, as `brokerctl
/// login NAME` would (the browser opens only for the login that started the flow), waits for
/// it, and asks for the token again. Progress goes to stderr, which git shows the user.
enum BridgeLogin {
    /// Whether someone may be there to sign in: `GIT_TERMINAL_PROMPT` is not `0` (git's, and
    /// CI's, way to say nobody is), and a display or a terminal (`/dev/tty`, where git itself
    /// asks for passwords) is at hand.
    static var userReachable: Bool {
        if let prompt = getenv("GIT_TERMINAL_PROMPT"), String(cString: prompt) == "0" { return false }
        if LoginSurroundings.current.hasDisplay { return true }
        let terminal = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC)
        guard terminal >= 0 else { return false }
        close(terminal)
        return true
    }

    /// The bearer token of `account`; a `needs_login` answer for an oauth2 account that was not
    /// logged out on purpose (`brokerctl logout`) is met with a sign-in first.
    static func token(of account: String, options: BridgeOptions) throws -> TokenResult {
        do {
            return try options.token(of: account)
        } catch let error as BrokerError where error.code == .needsLogin {
            let status = try options.client().perform(.status(account: account)).accounts.first
            guard let status, status.provider == "oauth2", status.state != "logged_out" else { throw error }
            try signIn(account, socket: options.socket)
            return try options.token(of: account)
        }
    }

    /// Runs (or joins) the login of `account` with the flow that suits where brokerctl runs;
    /// Ctrl-C cancels it, as it does `brokerctl login`.
    private static func signIn(_ account: String, socket: String?) throws {
        let surroundings = LoginSurroundings.current
        let flow = surroundings.preferredFlow
        let screen = LoginScreen(
            account: account, json: false, terminal: isatty(STDERR_FILENO) == 1, remote: surroundings.isRemote,
            drawsQR: true)
        let session = LoginSession(
            screen: screen, flow: flow, opensBrowser: flow == .browser && surroundings.hasDisplay)
        screen.note("\(account) needs you to sign in; git waits for it")
        Interruption.trap()
        let client = BlockingBrokerClient(socketPath: socket ?? DefaultPaths().socket, timeout: nil)
        do {
            _ = try session.run(.login(account: account, flow: flow), client: client)
        } catch let cancelled as LoginCancelled {
            throw ExitCode(128 + cancelled.signal)
        }
    }
}
