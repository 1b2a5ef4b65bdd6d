import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// brokerctl: inspect and manage brokerd, and fetch tokens in scripts.
struct Brokerctl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "brokerctl", abstract: "Inspect and manage tokenbroker; print tokens for scripts.",
        discussion: "Exit codes:\n" + ExitStatus.table.map { "  \($0.code) \($0.meaning)" }.joined(separator: "\n"),
        version: Release.version,
        subcommands: [
            Status.self, Token.self, Watch.self, Login.self, Add.self, SetTokens.self, Remove.self, Refresh.self,
            Logout.self, Reload.self, Unlock.self, Lock.self, Rekey.self, GitCredential.self, DockerCredential.self,
            KubeCredential.self, Exec.self, Header.self, Completion.self, Fleet.self, Share.self, Unshare.self,
            Update.self,
        ])
}

/// Where the broker is and how to print: options every subcommand takes.
struct ConnectionOptions: ParsableArguments {
    @Option(help: "Socket path (default: $TOKENBROKER_SOCKET or $XDG_RUNTIME_DIR/tokenbroker/broker.sock).")
    var socket: String?

    @Flag(help: "Print the result as JSON.")
    var json = false
}

/// Options every subcommand but `login` takes (its `--timeout` is the time the user has to sign in).
struct GlobalOptions: ParsableArguments {
    @OptionGroup var connection: ConnectionOptions

    @Option(help: "Seconds to wait for the broker's answer (it may be refreshing at the IdP).")
    var timeout: Double = 120

    var socket: String? { connection.socket }
    var json: Bool { connection.json }

    /// Sends `call`, prints its result, and turns failures into a message on stderr and a
    /// distinct exit code; returns the result.
    @discardableResult
    func run<Result: Encodable>(_ call: BrokerCall<Result>, human: (Result) -> String) throws -> Result {
        let result = try Self.reportingFailures(account: call.request.account, socket: socket) {
            try client().perform(call)
        }
        try show(result, human: human)
        return result
    }

    /// Prints `result`: as JSON with `--json`, else as `human` says (nothing when it says "").
    func show<Result: Encodable>(_ result: Result, human: (Result) -> String) throws {
        if json {
            let data = try Wire.makeEncoder().encode(result)
            print(String(decoding: data, as: UTF8.self))
        } else {
            let text = human(result)
            if !text.isEmpty { print(text) }
        }
    }

    /// A client of the broker at `--socket` with the `--timeout` of these options.
    func client() throws -> BlockingBrokerClient {
        try Self.client(socket: socket, timeout: timeout)
    }

    /// A client of the broker at `socket` (the default path when `nil`) that waits `timeout` seconds.
    static func client(socket: String?, timeout: Double) throws -> BlockingBrokerClient {
        guard timeout.isFinite, timeout > 0, timeout <= Bounds.maximumLifetime else {
            throw ValidationError("--timeout must be a number of seconds above 0")
        }
        return BlockingBrokerClient(
            socketPath: socket ?? DefaultPaths().socket, timeout: .milliseconds(Bounds.milliseconds(timeout)))
    }

    /// Runs `body`; a failure becomes a message on stderr and the exit code that says what failed.
    func reportingFailures<T>(_ body: () throws -> T) throws -> T { try Self.reportingFailures(body) }

    /// Runs `body`; a failure becomes a message on stderr and the exit code that says what failed.
    /// An `account` the broker does not know gets the nearest name among those `status` at
    /// `socket` shows this caller (only accounts it may use), when one is close.
    static func reportingFailures<T>(account: String? = nil, socket: String? = nil, _ body: () throws -> T) throws
        -> T
    {
        do {
            return try body()
        } catch let error as ConnectionError where error.timedOut {
            StandardStream.error.write("brokerctl: \(error); try again, or wait longer with --timeout\n")
            throw ExitCode(.brokerTimedOut)
        } catch let error as ConnectionError {
            StandardStream.error.write("brokerctl: \(error)\n")
            throw ExitCode(.brokerNotRunning)
        } catch let error as BrokerError {
            let suggestion = error.code == .notFound ? account.flatMap { nearestAccount(to: $0, socket: socket) } : nil
            StandardStream.error.write(
                "brokerctl: \(error.message)\(Self.hint(error))"
                    + (suggestion.map { "; did you mean \(JSONText.quote($0))?" } ?? "") + "\n")
            throw ExitCode(Self.exitStatus(error.code))
        }
    }

    /// The account name nearest to `name` among those the broker shows this caller, if close.
    private static func nearestAccount(to name: String, socket: String?) -> String? {
        Suggestion.nearest(to: name, among: AccountNames.visible(socket: socket, timeout: 2))
    }

    static func exitStatus(_ code: BrokerError.Code) -> ExitStatus {
        switch code {
        case .notFound: .notFound
        case .needsLogin: .needsLogin
        case .unavailable, .busy: .unavailable
        case .forbidden: .forbidden
        case .locked: .locked
        case .lifetimeTooShort: .lifetimeTooShort
        default: .failure
        }
    }

    private static func hint(_ error: BrokerError) -> String {
        guard let wait = error.retryAfterMs else { return "" }
        return " (retry in \(max(1, wait / 1000)) s)"
    }
}

/// Reads a JSON document from a file, or from stdin for "-", so secrets never appear in argv.
/// Input that is missing or malformed is a data error, not a usage error: one line on stderr
/// and sysexits' code (66, 65), no usage text.
enum SecretInput {
    /// The largest document read (a tokens object is a few KiB).
    static let maximumSize = 1 << 20

    /// The document `option` names (`--secrets`, `--from`) in `source`, decoded as `type`.
    static func read<T: Decodable>(_ source: String, option: String, as type: T.Type) throws -> T {
        let name = source == "-" ? "stdin" : source
        let fd = source == "-" ? STDIN_FILENO : open(source, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw fail(.noInput, "cannot read \(option) \(source): \(String(cString: strerror(errno)))")
        }
        defer { if fd != STDIN_FILENO { close(fd) } }
        let data: Data
        do {
            data = Data(try BoundedInput.read(fd, limit: maximumSize))
        } catch .tooLarge {
            throw fail(.dataError, "\(option): \(name) is larger than 1 MiB")
        } catch {
            throw fail(.noInput, "cannot read \(option) \(name)")
        }
        do {
            return try Wire.makeDecoder().decode(T.self, from: data)
        } catch {
            throw fail(.dataError, "\(option): \(name) is not a JSON tokens object")
        }
    }

    /// Writes `message` on stderr; the exit with `status`.
    private static func fail(_ status: ExitStatus, _ message: String) -> ExitCode {
        StandardStream.error.write("brokerctl: \(message)\n")
        return ExitCode(status)
    }
}

/// Standard output and error (or another descriptor), written to directly: a line appears at
/// once, even in a pipe.
struct StandardStream {
    static let output = StandardStream(descriptor: STDOUT_FILENO)
    static let error = StandardStream(descriptor: STDERR_FILENO)

    let descriptor: Int32

    /// Writes all of `text`, retrying after a signal or a short write; `false` when it could not.
    @discardableResult
    func write(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = Glibc.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0, errno == EINTR { continue }
                guard written > 0 else { return false }
                offset += written
            }
            return true
        }
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status", abstract: "Show the state of every account, or of those named.",
        discussion: "Accounts named that do not exist are listed on stderr, with exit 4, after the others.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account names (all when none are given).", completion: AccountNames.completion)
    var accounts: [String] = []

    func run() throws {
        // One name is asked of the broker, which suggests a near name when it is unknown.
        let one = accounts.count == 1 ? accounts.first : nil
        var result = try GlobalOptions.reportingFailures(account: one, socket: options.socket) {
            try options.client().perform(.status(account: one))
        }
        let unknown = accounts.filter { name in !result.accounts.contains { $0.account == name } }
        if accounts.count > 1 { result.accounts.removeAll { !accounts.contains($0.account) } }
        try options.show(result) { result in
            (result.locked == true ? "the broker is locked; run brokerctl unlock\n" : "")
                + (result.memoryLocked == false
                    ? "warning: secrets are not all locked in memory (RLIMIT_MEMLOCK reached); see brokerd's log\n"
                    : "")
                + ([StatusTable.render(result.accounts, now: Date())]
                + StatusTable.hints(result.accounts, socket: options.socket))
                .joined(separator: "\n")
        }
        guard unknown.isEmpty else {
            let names = unknown.map { JSONText.quote($0) }.joined(separator: ", ")
            StandardStream.error.write("brokerctl: no account named \(names); list them with brokerctl status\n")
            throw ExitCode(.notFound)
        }
    }
}

struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token",
        abstract:
            "Print an access token (only the token), e.g. for curl -H \"Authorization: Bearer $(brokerctl token api)\"."
    )

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @Option(help: "Seconds the token must stay valid.") var minTTL: Double?
    @Flag(help: "Print the account's OpenID Connect id token instead (exit 4 when its IdP issued none).")
    var idToken = false
    @Flag(help: "When no token lasts --min-ttl, print the freshest one with a warning on stderr, and exit 0.")
    var bestEffort = false
    @OptionGroup var narrowing: Narrowing
    @Option(help: "DPoP: the HTTP method of the request to prove (with --dpop-url; the proof follows the token).")
    var dpopMethod: String?
    @Option(help: "DPoP: the URL of the request to prove (https, or http on loopback).") var dpopURL: String?
    @Option(help: "DPoP: the nonce the resource server gave.") var dpopNonce: String?

    func validate() throws {
        if idToken, narrowing.scope != nil || narrowing.resource != nil || dpopMethod != nil || bestEffort {
            throw ValidationError("--id-token takes no --scope, --resource, --dpop-method or --best-effort")
        }
        if (dpopMethod == nil) != (dpopURL == nil) {
            throw ValidationError("give --dpop-method and --dpop-url together")
        }
        if dpopNonce != nil, dpopMethod == nil { throw ValidationError("--dpop-nonce goes with --dpop-method") }
    }

    func run() throws {
        if idToken {
            try options.run(.idToken(account: account, minTTL: minTTL)) { $0.idToken }
        } else {
            let dpop = dpopMethod.map { DPoPRequest(htm: $0, htu: dpopURL, nonce: dpopNonce) }
            let token = try GlobalOptions.reportingFailures(account: account, socket: options.socket) {
                try BestEffort.token(minTTL: minTTL, enabled: bestEffort) { minTTL in
                    try options.client().perform(
                        .token(
                            account: account, minTTL: minTTL, scope: narrowing.scope, resource: narrowing.resource,
                            dpop: dpop))
                }
            }
            try options.show(token) { token in
                token.dpopProof.map { token.accessToken + "\n" + $0 } ?? token.accessToken
            }
        }
    }
}

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract:
            "Show the state of the accounts, then their events live (refreshed, refresh_failed, needs_login, logged_out, added, removed, valid).",
        discussion: """
            First comes one "state" line per watched account, as status shows it; then one line per \
            event. valid: an account that was down (needs_login, logged_out, failing refreshes) serves \
            a token again. With --reconnect (the default when standard output is a terminal), a broker \
            that stops or restarts does not end the watch: brokerctl says so on stderr, connects again \
            (after 0.2 s, doubling up to 5 s), says when it is back, shows the state again and goes on.
            """)

    @OptionGroup var options: GlobalOptions
    @Flag(
        inversion: .prefixedNo,
        help: "Keep watching across broker restarts (default: on when standard output is a terminal).")
    var reconnect: Bool?
    @Argument(help: "Accounts to watch (all when none are given).", completion: AccountNames.completion) var accounts:
        [String] = []

    func run() throws {
        let client = try options.client()
        let watched = accounts.isEmpty ? nil : accounts
        let showState = {
            let status = try client.perform(.status())
            for account in status.accounts where watched?.contains(account.account) ?? true {
                StandardStream.output.write(
                    (options.json ? EventText.json(account, at: Date()) : EventText.human(account, at: Date())) + "\n")
            }
        }
        let show: (BrokerEvent) -> Void = { event in
            StandardStream.output.write((options.json ? EventText.json(event) : EventText.human(event)) + "\n")
        }
        try options.reportingFailures {
            if reconnect ?? (isatty(STDOUT_FILENO) == 1) {
                let socket = client.socketPath
                try EventFollower(
                    client: client, accounts: watched, lost: { "lost the broker at \(socket) (\($0)); reconnecting" },
                    back: "reconnected to the broker at \(socket)"
                ).run(subscribed: showState, show)
            } else {
                try client.watch(accounts: watched, subscribed: showState, show)
            }
        }
    }
}

/// How `watch` prints an event, and an account's state before the events.
enum EventText {
    static func human(_ event: BrokerEvent) -> String {
        var text = "\(Wire.rfc3339(event.at))  \(padded(event.event.rawValue, to: 14))  \(event.account)"
        if let expiresAt = event.expiresAt { text += "  expires \(Wire.rfc3339(expiresAt))" }
        if let message = event.message { text += "  \(message)" }
        return text
    }

    static func json(_ event: BrokerEvent) -> String {
        (try? Wire.makeEncoder().encode(event)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    /// `at  state  ACCOUNT  STATE  expires …  last error`.
    static func human(_ account: AccountStatus, at now: Date) -> String {
        var text = "\(Wire.rfc3339(now))  \(padded("state", to: 14))  \(account.account)  \(account.state)"
        if let expiresAt = account.expiresAt { text += "  expires \(Wire.rfc3339(expiresAt))" }
        if let message = account.lastError?.message { text += "  \(message)" }
        return text
    }

    /// `{"state", "account", "at", "expires_at"?, "message"?}`: no `event`, so it reads apart from events.
    static func json(_ account: AccountStatus, at now: Date) -> String {
        let line = StateLine(
            state: account.state, account: account.account, at: now, expiresAt: account.expiresAt,
            message: account.lastError?.message)
        return (try? Wire.makeEncoder().encode(line)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    private struct StateLine: Encodable {
        var state: String
        var account: String
        var at: Date
        var expiresAt: Date?
        var message: String?

        enum CodingKeys: String, CodingKey {
            case state, account, at, message
            case expiresAt = "expires_at"
        }
    }
}

struct Add: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add",
        abstract: "Add an account.",
        discussion: """
            Secrets are read as a JSON object from --secrets (a file, or - for stdin), never from the
            command line: {"refresh_token": "...", "client_secret": "...", "access_token": "...", "expires_in": 3600}
            A refresh_url account's URL is a secret too: {"refresh_url": "https://..."}.
            An exec account's argv is given with one --command per argument, e.g.
            --command /usr/local/bin/get-token --command --profile --command work (no shell is involved).
            A file account serves the token in a JSON file another program keeps, e.g.
            --kind file --path /home/me/.cache/api-token.json ({"access_token": ..., "expires_in": ...}).
            """)

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.") var account: String
    @Option(
        help: "Provider kind: oauth2, refresh_url, sliding, exec, file or static.",
        completion: .list(["oauth2", "refresh_url", "sliding", "exec", "file", "static"]))
    var kind: String
    @OptionGroup var provider: ProviderOptions
    @Option(help: "File with the secrets as JSON, or - for stdin.") var secrets: String?
    @Flag(help: "Create it in the fleet's shared store, served by every broker of the fleet (docs/fleet.md).")
    var shared = false
    @Flag(help: "Exit 0 though the account cannot serve a token yet (no secrets given); else it exits 5.")
    var allowEmpty = false

    func run() throws {
        var spec = provider.spec(kind: kind)
        var tokens: TokenSet?
        if let secrets {
            let input = try SecretInput.read(secrets, option: "--secrets", as: AddSecrets.self)
            spec["client_secret"] = input.clientSecret.map(JSONValue.string)
            tokens = input.tokens
        }
        let added = try options.run(.add(account: account, provider: spec, tokens: tokens, shared: shared)) {
            "added \($0.account)\(shared ? " to the fleet" : "") (\($0.state))"
        }
        // An oauth2 account without a refresh token shows `refreshing` until its first try fails:
        // without secrets, only the kinds that fetch their own token (exec, file) can serve.
        let empty = tokens == nil && !["exec", "file"].contains(kind)
        guard !allowEmpty, empty || ["needs_login", "logged_out"].contains(added.state) else { return }
        let name = ShellWord.quoted(account)
        let signsIn =
            kind == "oauth2"
            && [provider.issuer, provider.deviceAuthorizationEndpoint, provider.authorizationEndpoint].contains {
                $0 != nil
            }
        StandardStream.error.write(
            "brokerctl: \(account) was added but has no token to serve yet; "
                + (signsIn ? "sign in with brokerctl login \(name)" : "push tokens with brokerctl set-tokens \(name)")
                + " (add --allow-empty to exit 0 for such an account)\n")
        throw ExitCode(.needsLogin)
    }
}

/// The secrets `brokerctl add` reads: a tokens object plus an optional client secret.
struct AddSecrets: Decodable {
    var clientSecret: String?
    var tokens: TokenSet?

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        clientSecret = try container.decodeIfPresent(String.self, forKey: .clientSecret)
        let tokens = try TokenSet(from: decoder)
        self.tokens = tokens == TokenSet() ? nil : tokens
    }

    enum CodingKeys: String, CodingKey { case clientSecret = "client_secret" }
}

struct SetTokens: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set-tokens",
        abstract: "Push new tokens into an account (clears needs_login).",
        discussion: "Reads a JSON tokens object from --from (a file, or - for stdin, the default).")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @Option(help: "File with the tokens as JSON, or - for stdin.") var from = "-"

    func run() throws {
        let tokens = try SecretInput.read(from, option: "--from", as: TokenSet.self)
        try options.run(.setTokens(account: account, tokens: tokens)) {
            "updated \($0.account) (\($0.state))"
        }
    }
}

struct Remove: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove", abstract: "Delete an account and its secrets.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func run() throws {
        try options.run(.remove(account: account)) { "removed \($0.account)" }
    }
}

struct Refresh: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "refresh", abstract: "Refresh an account now, ignoring its schedule.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func run() throws {
        try options.run(.refresh(account: account)) { "refreshed \($0.account) (\($0.state))" }
    }
}

struct Logout: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "logout",
        abstract: "Revoke an account's credential at the IdP where it can be, then discard its tokens.",
        discussion: """
            The account and its settings stay (state logged_out) until new tokens are pushed with
            set-tokens. While the IdP cannot be reached, logout is refused and nothing is discarded,
            unless --force.
            """)

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @Flag(help: "Discard the credential even if the IdP cannot be reached to revoke it.") var force = false

    func run() throws {
        try options.run(.logout(account: account, force: force)) {
            "logged out \($0.account)" + ($0.revoked ? " (revoked at the IdP)" : " (discarded; not revoked at the IdP)")
        }
    }
}

struct Reload: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reload",
        abstract: "Make the broker re-read broker.toml (a broken file is refused and changes nothing).")

    @OptionGroup var options: GlobalOptions

    func run() throws {
        try options.run(.reload()) { "reloaded (\($0.accounts) accounts)" }
    }
}

/// The human form of `status`.
enum StatusTable {
    static func render(_ accounts: [AccountStatus], now: Date) -> String {
        guard !accounts.isEmpty else { return "no accounts" }
        var rows = [["ACCOUNT", "PROVIDER", "STATE", "EXPIRES IN", "NEXT REFRESH", "LAST ERROR"]]
        for account in accounts {
            rows.append([
                account.account, account.provider + (account.shared == true ? " (shared)" : ""),
                account.state.replacing("_", with: " "),
                account.expiresAt.map { duration($0.timeIntervalSince(now)) } ?? "-",
                account.nextRefreshAt.map { "in " + duration($0.timeIntervalSince(now)) } ?? "-",
                account.lastError?.message ?? "",
            ])
        }
        let widths = (0..<rows[0].count).map { column in rows.map { $0[column].count }.max() ?? 0 }
        return rows.map { row in
            var line = zip(row, widths).map { padded($0, to: $1) }.joined(separator: "  ")
            while line.last == " " { line.removeLast() }
            return line
        }.joined(separator: "\n")
    }

    /// For each account that serves no token or whose refreshes fail, the broker's advice (a
    /// command that works for that account, with `--socket` when one was given); each account
    /// whose scope the IdP narrowed; each account's DPoP key (and an IdP that issued bearer
    /// tokens to it); preceded by a blank line when there are any.
    static func hints(_ accounts: [AccountStatus], socket: String?) -> [String] {
        let socketOption = socket.map { " --socket " + ShellWord.quoted($0) } ?? ""
        let restore = accounts.compactMap { account in
            account.advice.map { advice in
                let command = account.adviceCommand ?? ""
                let shown = command.isEmpty ? advice : advice.replacing(command, with: command + socketOption)
                return "\(account.account): \(shown)"
            }
        }
        let narrowed = accounts.compactMap { account in
            account.lostScope.map { "\(account.account): the IdP no longer grants the scope \($0)" }
        }
        let dpop = accounts.compactMap { account in
            account.dpop.map { key in
                "\(account.account): DPoP \(key.algorithm), key thumbprint \(key.thumbprint)"
                    + (key.issuedTokenType.map { "; the IdP ignored it and issued a \($0) token" } ?? "")
            }
        }
        let hints = restore + narrowed + dpop
        return hints.isEmpty ? [] : [""] + hints
    }

    static func duration(_ seconds: TimeInterval) -> String {
        if seconds <= 0 { return "expired" }
        let whole = Bounds.wholeSeconds(seconds)
        if whole < 120 { return "\(whole)s" }
        if whole < 7200 { return "\(whole / 60)m" }
        if whole < 172800 { return "\(whole / 3600)h" }
        return "\(whole / 86400)d"
    }
}

/// `text` with spaces added up to `width` characters.
func padded(_ text: String, to width: Int) -> String {
    text + String(repeating: " ", count: max(0, width - text.count))
}

/// Text quoted for a POSIX shell, so a command shown to the user can be pasted as it is.
enum ShellWord {
    /// `text` as it is when it holds only characters no shell reads specially, else in single quotes.
    static func quoted(_ text: String) -> String {
        let plain =
            !text.isEmpty
            && text.utf8.allSatisfy { byte in
                (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                    || Array("/._-@%+=:,".utf8).contains(byte)
            }
        return plain ? text : "'" + text.replacing("'", with: #"'\''"#) + "'"
    }
}
