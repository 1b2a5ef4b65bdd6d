import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

extension LoginFlow: ExpressibleByArgument {}

/// `brokerctl login NAME`: signs an oauth2 account in at its IdP. The broker runs the grant,
/// talks to the token endpoint and keeps every token; brokerctl only shows the user where to go
/// and waits for the outcome, so no token or client secret passes through it.
struct Login: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "login",
        abstract: "Sign in to an oauth2 account at its IdP (a code to enter, or the browser); creates or restores it.",
        discussion: """
            Example: brokerctl login work --issuer https://accounts.example.com --client-id my-cli \
            --scope "openid offline_access"

            The broker runs the sign-in and keeps the tokens: none passes through brokerctl. A new \
            account is created when the sign-in succeeds; an existing one (e.g. in needs login) is \
            restored in place with its own settings (give no provider options, or the same ones). A \
            client secret is read by the broker itself from --secrets (a file, or - for stdin), as \
            {"client_secret": "..."}.

            The code or URL goes to stderr (with a countdown on a terminal), the result to stdout.

            Exit codes: 0 signed in, 5 denied, expired or timed out, 6 IdP unavailable, 4 no such \
            account (give its provider options), 130 cancelled with Ctrl-C (129 SIGHUP, 143 SIGTERM); \
            brokerctl --help lists the others.
            """)

    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @Option(help: "Provider kind (only oauth2 accounts sign in).") var kind = "oauth2"
    @OptionGroup var provider: ProviderOptions
    @Option(help: "File holding {\"client_secret\": ...}, or - for stdin; the broker reads it, brokerctl does not.")
    var secrets: String?
    @Option(
        help:
            "device (enter a code on any device) or browser (sign in on this machine). Default: device over SSH or without a display, else browser."
    )
    var flow: LoginFlow?
    @Flag(help: "Do not open a browser; only print the URL.") var noBrowser = false
    @Flag(
        name: .customLong("no-qr"), help: "device: do not draw the QR code of the sign-in link (drawn on a terminal).")
    var noQR = false
    @Flag(help: "Then share the new account with the fleet, as brokerctl share does (docs/fleet.md).")
    var shared = false
    @Option(help: "Seconds you have to sign in, 1-3600 (default: 180 for browser, the code's lifetime for device).")
    var timeout: Double?
    @Option(
        help:
            "browser: the loopback port the IdP redirects to, for IdPs that register a fixed one (default: any free port)."
    )
    var redirectPort: Int?

    func validate() throws {
        if let timeout, !(timeout.isFinite && timeout >= 1 && timeout <= 3600) {
            throw ValidationError("--timeout must be a number of seconds from 1 to 3600")
        }
        if let redirectPort {
            guard (1...65535).contains(redirectPort) else { throw ValidationError("--redirect-port must be 1-65535") }
            guard chosenFlow == .browser else {
                throw ValidationError("--redirect-port is for the browser flow; add --flow browser")
            }
        }
        if secrets == "-", isatty(STDIN_FILENO) == 1 {
            throw ValidationError(
                #"--secrets - reads {"client_secret": ...} from stdin: pipe it in, or give a file"#)
        }
    }

    /// The flow asked for, or the one that suits where brokerctl runs.
    var chosenFlow: LoginFlow { flow ?? LoginSurroundings.current.preferredFlow }

    func run() throws {
        let surroundings = LoginSurroundings.current
        let flow = chosenFlow
        let screen = LoginScreen(
            account: account, json: connection.json, terminal: isatty(STDERR_FILENO) == 1,
            remote: surroundings.isRemote, drawsQR: !noQR && isatty(STDOUT_FILENO) == 1)
        let session = LoginSession(
            screen: screen, flow: flow, opensBrowser: flow == .browser && surroundings.hasDisplay && !noBrowser)
        let call = try call(flow: flow)
        Interruption.trap()
        let client = BlockingBrokerClient(socketPath: connection.socket ?? DefaultPaths().socket, timeout: nil)
        do {
            let result = try GlobalOptions.reportingFailures { try session.run(call, client: client) }
            // With --shared, the login is over once the account is in the fleet's database: it
            // is told done only then (an account shared already got its tokens in its row).
            var moved: AccountResult?
            if shared {
                do {
                    moved = try GlobalOptions.reportingFailures(account: account, socket: connection.socket) {
                        try client.perform(.status(account: account)).accounts.first?.shared == true
                            ? nil : try client.perform(.share(account: account))
                    }
                } catch {
                    StandardStream.error.write(
                        "signed in: \(account) is on this host, not yet in the fleet (see above; brokerctl share \(account))\n"
                    )
                    throw error
                }
            }
            screen.succeed(result)
            if let moved { StandardStream.error.write("shared \(moved.account) with the fleet\n") }
        } catch let cancelled as LoginCancelled {
            throw ExitCode(128 + cancelled.signal)
        }
    }

    /// The `login` request these options make. The provider goes along only when a setting was
    /// given: an existing account is then restored with its own settings.
    private func call(flow: LoginFlow) throws -> BrokerCall<LoginResult> {
        let spec = provider.spec(kind: kind)
        return .login(
            account: account, flow: flow, provider: spec.fields.isEmpty ? nil : spec,
            secretsFile: try secrets.map(Self.secretsPath), redirectPort: redirectPort, timeout: timeout)
    }

    /// The path the broker opens for `--secrets`: this process's stdin for `-` (the broker reads
    /// `/proc/<pid>/fd/0` of its peer), else the file's absolute path.
    private static func secretsPath(_ source: String) throws -> String {
        if source == "-" { return "/proc/\(getpid())/fd/0" }
        if source.hasPrefix("/") { return source }
        guard let directory = getcwd(nil, 0) else { throw ValidationError("cannot tell the current directory") }
        defer { free(directory) }
        return String(cString: directory) + "/" + source
    }
}

/// What brokerctl's environment says about where the user sits.
struct LoginSurroundings {
    /// A graphical session: `DISPLAY` or `WAYLAND_DISPLAY` is set.
    var hasDisplay: Bool
    /// An SSH session: `SSH_CONNECTION` is set.
    var isRemote: Bool

    static var current: LoginSurroundings {
        let isSet = { (name: String) in getenv(name).map { $0.pointee != 0 } ?? false }
        return LoginSurroundings(
            hasDisplay: isSet("DISPLAY") || isSet("WAYLAND_DISPLAY"), isRemote: isSet("SSH_CONNECTION"))
    }

    /// The device flow without a display or over SSH (no browser here can reach this loopback
    /// redirect, or none at all), else the browser flow.
    var preferredFlow: LoginFlow { hasDisplay && !isRemote ? .browser : .device }
}

/// The user pressed Ctrl-C, or brokerctl was told to end (SIGTERM, SIGHUP): the login was given
/// up (closing the connection cancels it at the broker).
struct LoginCancelled: Error {
    /// The signal that ended it.
    var signal: Int32
}

/// One login's progress as it comes: shows it, opens the browser, and bounds the wait. A login
/// that joined one already running (`joined`) opens no browser: the one that started it did.
final class LoginSession {
    /// How long the broker may take besides the user's time: discovery and the device
    /// authorization request before the first progress line, the code exchange after the last.
    static let brokerAllowance: Duration = .seconds(120)

    private let screen: LoginScreen
    /// The flow asked for.
    private let flow: LoginFlow
    private var opensBrowser: Bool
    /// When to stop waiting for the broker's final line.
    private var deadline = ContinuousClock.now + brokerAllowance
    private var browser: BrowserLauncher?
    /// The page the browser was sent to, removed when the login ends.
    private var page: LoginPage?

    init(screen: LoginScreen, flow: LoginFlow, opensBrowser: Bool) {
        self.screen = screen
        self.flow = flow
        self.opensBrowser = opensBrowser
    }

    /// Runs `call` with `client`, showing its progress until its answer; a failure is shown too.
    func run(_ call: BrokerCall<LoginResult>, client: BlockingBrokerClient) throws -> LoginResult {
        defer { end() }
        do {
            return try client.perform(call, idleInterval: screen.tickInterval, idle: idle, progress: progress)
        } catch {
            screen.fail(error)
            throw error
        }
    }

    /// Runs while no line arrives: stops on Ctrl-C or a broker silent past the login's time,
    /// reaps the browser opener, redraws the progress line.
    func idle() throws {
        if let signal = Interruption.caught { throw LoginCancelled(signal: signal) }
        if browser?.reap() == true { browser = nil }
        let now = ContinuousClock.now
        guard now < deadline else {
            throw ConnectionError(description: "the broker did not answer in time", timedOut: true)
        }
        screen.tick(now: now)
    }

    /// Shows one progress line; the authorization URL is also opened in the browser.
    func progress(_ line: Data) throws {
        if let signal = Interruption.caught { throw LoginCancelled(signal: signal) }
        guard let progress = try? Wire.makeDecoder().decode(LoginProgress.self, from: line) else { return }
        let now = ContinuousClock.now
        if let expiresIn = progress.expiresIn, (1...3600).contains(expiresIn) {
            deadline = now + .seconds(expiresIn) + Self.brokerAllowance
        }
        switch progress.event {
        case .deviceCode:
            screen.showDeviceCode(progress, now: now)
        case .authorizationURL:
            guard let url = progress.url else { return }
            let opening = opensBrowser && open(url)
            screen.showAuthorizationURL(progress, opening: opening, now: now)
        case .joined:
            opensBrowser = false
            screen.showJoined(running: progress.flow, asked: flow)
        case .slowDown:
            break
        }
    }

    /// Opens the broker's start link by way of a page file (`LoginPage`): `xdg-open` is given
    /// the page's name, not the link. `false` when the browser could not be started.
    private func open(_ link: String) -> Bool {
        let written: LoginPage
        switch LoginPage.write(leadingTo: link) {
        case .success(let page): written = page
        case .failure(let problem):
            screen.note("cannot write the sign-in page (\(problem)); open the URL yourself")
            return false
        }
        switch BrowserLauncher.open(written.url) {
        case .success(let launcher):
            browser = launcher
            page = written
            return true
        case .failure(let problem):
            written.remove()
            screen.note("cannot start xdg-open (\(problem)); open the URL yourself")
            return false
        }
    }

    /// Reaps the browser opener, waiting for it a second at most (xdg-open usually returns at
    /// once, but with some browsers it stays until the browser closes), and removes the page.
    func end() {
        page?.remove()
        page = nil
        guard let browser else { return }
        let limit = ContinuousClock.now + .seconds(1)
        while !browser.reap(), ContinuousClock.now < limit { usleep(10_000) }
        self.browser = nil
    }
}

/// Ctrl-C (or SIGTERM, SIGHUP) during a login, noted by a signal handler and acted on at the
/// next idle tick, so the progress line is cleared, the sign-in page removed and the connection
/// closed before brokerctl exits.
enum Interruption {
    /// The signal received; 0 while none.
    private static let received = Atomic<Int32>(0)

    /// Installs the handlers.
    static func trap() {
        // Initialised here, not lazily inside the handler.
        _ = received.load(ordering: .relaxed)
        for number in [SIGINT, SIGTERM, SIGHUP] {
            signal(number) { Interruption.received.store($0, ordering: .relaxed) }
        }
    }

    /// The signal received, if any.
    static var caught: Int32? {
        let number = received.load(ordering: .relaxed)
        return number == 0 ? nil : number
    }
}
