import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// What the user sees of a login. Humans: the code or URL on stderr, on a terminal a spinner
/// and countdown redrawn in place on stderr, and only the result on stdout. `--json`: one
/// object per line on stdout (`device_code` or `authorization_url`, then `done` or `error`).
final class LoginScreen {
    private let account: String
    private let json: Bool
    /// Whether the progress line is drawn (stderr is a terminal, and not `--json`).
    private let animated: Bool
    /// Whether the session is remote (SSH), where a browser elsewhere cannot reach the redirect.
    private let remote: Bool
    /// Whether the device flow's QR code is drawn (both streams are terminals, and not `--json`).
    private let drawsQR: Bool
    /// When the user's time to sign in runs out, once the broker has said.
    private var countdownEnd: ContinuousClock.Instant?
    private var frame = 0
    /// Whether a progress line is on the screen (and must be cleared before other text).
    private var drawn = false

    init(account: String, json: Bool, terminal: Bool, remote: Bool, drawsQR: Bool) {
        self.account = account
        self.json = json
        self.animated = terminal && !json
        self.remote = remote
        self.drawsQR = drawsQR && terminal && !json
    }

    /// How often the wait wakes up: to redraw the progress line, or only to notice Ctrl-C.
    var tickInterval: Duration { animated ? .milliseconds(100) : .milliseconds(250) }

    /// Device flow: where to go and the code to enter.
    func showDeviceCode(_ progress: LoginProgress, now: ContinuousClock.Instant) {
        startCountdown(progress, now: now)
        let uri = progress.verificationURI.map(Self.printable) ?? ""
        let complete = progress.verificationURIComplete.map(Self.printable)
        let code = progress.userCode.map(Self.printable) ?? ""
        if json {
            emit(
                LoginLine(
                    event: "device_code", verificationURI: uri, verificationURIComplete: complete, userCode: code,
                    expiresIn: progress.expiresIn))
            return
        }
        var text = "To sign in to \(account), open \(uri) in a browser and enter the code: \(code)\n"
        if let complete { text += "Or open this link, which fills the code in: \(complete)\n" }
        if drawsQR, let rows = progress.qrCode, let drawing = HalfBlocks.drawing(of: rows) {
            text += "Or scan it with a phone:\n" + drawing
        }
        say(text)
    }

    /// Browser flow: the URL to open (`opening`: xdg-open was started with it).
    func showAuthorizationURL(_ progress: LoginProgress, opening: Bool, now: ContinuousClock.Instant) {
        startCountdown(progress, now: now)
        let url = progress.url.map(Self.printable) ?? ""
        if json {
            emit(LoginLine(event: "authorization_url", url: url))
            return
        }
        var text =
            opening
            ? "Opening a browser to sign in to \(account); if none opens, open this URL:\n\(url)\n"
            : "To sign in to \(account), open this URL in a browser on this machine:\n\(url)\n"
        if remote, let redirect = progress.redirectURI.map(Self.printable),
            let port = URLComponents(string: redirect)?.port
        {
            text +=
                "The IdP sends the browser back to \(redirect) on this machine; from a browser elsewhere, "
                + "forward that port first: ssh -L \(port):127.0.0.1:\(port) THIS-HOST\n"
        }
        say(text)
    }

    /// The login joined one already running (`running`: its flow, when the broker said).
    func showJoined(running: LoginFlow?, asked: LoginFlow) {
        if json {
            emit(LoginLine(event: "joined", flow: running?.rawValue))
            return
        }
        var text = "a sign-in for \(account) is already open; waiting for it"
        if let running, running != asked { text += " (it uses the \(running.rawValue) flow, not \(asked.rawValue))" }
        say(text + "\n")
    }

    /// A remark for the user (stderr).
    func note(_ text: String) {
        say("brokerctl: \(text)\n")
    }

    /// Redraws the progress line in place: a spinner, and the time left once known.
    func tick(now: ContinuousClock.Instant) {
        guard animated else { return }
        frame += 1
        let spinner = Array("|/-\\")[frame % 4]
        var text = "\r\u{1B}[K\(spinner) "
        if let countdownEnd {
            let left = max(0, now.duration(to: countdownEnd).components.seconds)
            text +=
                "waiting for you to sign in (\(left / 60):\(left % 60 < 10 ? "0" : "")\(left % 60) left; Ctrl-C cancels)"
        } else {
            text += "starting the sign-in"
        }
        StandardStream.error.write(text)
        drawn = true
    }

    /// The login ended with `error`: clears the progress line; says so for Ctrl-C, and with
    /// `--json` prints the error object (other messages come from `GlobalOptions.reportingFailures`).
    func fail(_ error: any Error) {
        clearLine()
        switch error {
        case let cancelled as LoginCancelled:
            StandardStream.error.write("brokerctl: cancelled\n")
            let message =
                cancelled.signal == SIGINT ? "cancelled with Ctrl-C" : "cancelled by signal \(cancelled.signal)"
            if json { emit(LoginLine(event: "error", code: "cancelled", message: message)) }
        case let error as BrokerError where json:
            emit(LoginLine(event: "error", code: error.code.rawValue, message: error.message))
        default:
            break
        }
    }

    /// The login succeeded: the result on stdout.
    func succeed(_ result: LoginResult) {
        clearLine()
        if json {
            emit(LoginLine(event: "done", account: result.account, state: result.state))
        } else {
            StandardStream.output.write("logged in \(result.account) (\(result.state))\n")
        }
    }

    private func startCountdown(_ progress: LoginProgress, now: ContinuousClock.Instant) {
        if let expiresIn = progress.expiresIn, (1...3600).contains(expiresIn) {
            countdownEnd = now + .seconds(expiresIn)
        }
    }

    /// Text for the user on stderr, below a cleared progress line.
    private func say(_ text: String) {
        clearLine()
        StandardStream.error.write(text)
    }

    private func clearLine() {
        guard drawn else { return }
        StandardStream.error.write("\r\u{1B}[K")
        drawn = false
    }

    private func emit(_ line: LoginLine) {
        guard let data = try? Wire.makeEncoder().encode(line) else { return }
        StandardStream.output.write(String(decoding: data, as: UTF8.self) + "\n")
    }

    /// A text from the IdP as it may reach a terminal: no control characters, at most 8 KiB.
    static func printable(_ text: String) -> String {
        String(
            String.UnicodeScalarView(
                text.unicodeScalars.filter { $0.properties.generalCategory != .control }.prefix(8192)))
    }
}

/// One object of `brokerctl login --json`; absent fields are left out.
struct LoginLine: Encodable {
    var event: String
    var verificationURI: String?
    var verificationURIComplete: String?
    var userCode: String?
    var expiresIn: Int?
    var url: String?
    var account: String?
    var state: String?
    var code: String?
    var message: String?
    var flow: String?

    enum CodingKeys: String, CodingKey {
        case event, url, account, state, code, message, flow
        case verificationURI = "verification_uri"
        case verificationURIComplete = "verification_uri_complete"
        case userCode = "user_code"
        case expiresIn = "expires_in"
    }
}
