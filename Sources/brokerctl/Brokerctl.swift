import ArgumentParser
import BrokerClient
import BrokerProtocol
import Foundation

/// brokerctl: inspect and manage brokerd, and fetch tokens in scripts.
@main
struct Brokerctl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "brokerctl", abstract: "Inspect and manage tokenbroker; print tokens for scripts.",
        discussion: """
            Exit codes: 0 ok, 1 other error, 3 broker not running, 4 not found, 5 needs login,
            6 unavailable, 7 forbidden, 8 locked.
            """,
        subcommands: [
            Status.self, Token.self, Watch.self, Add.self, SetTokens.self, Remove.self, Refresh.self, Logout.self,
            Reload.self,
        ])
}

/// Options every subcommand takes.
struct GlobalOptions: ParsableArguments {
    @Option(help: "Socket path (default: $TOKENBROKER_SOCKET or $XDG_RUNTIME_DIR/tokenbroker/broker.sock).")
    var socket: String?

    @Flag(help: "Print the result as JSON.")
    var json = false

    /// Connects, runs `body`, and turns failures into a message on stderr and a distinct exit code.
    func run<T: Encodable>(_ body: (BrokerClient) async throws -> T, human: (T) -> String) async throws {
        do {
            let client = try BrokerClient(socketPath: socket ?? DefaultPaths().socket)
            defer { client.close() }
            let result = try await body(client)
            if json {
                let data = try Wire.makeEncoder().encode(result)
                print(String(decoding: data, as: UTF8.self))
            } else {
                let text = human(result)
                if !text.isEmpty { print(text) }
            }
        } catch let error as ConnectionError {
            FileHandle.standardError.write(Data("brokerctl: \(error)\n".utf8))
            throw ExitCode(3)
        } catch let error as BrokerError {
            FileHandle.standardError.write(Data("brokerctl: \(error.message)\(Self.hint(error))\n".utf8))
            throw ExitCode(Self.exitCode(error.code))
        }
    }

    static func exitCode(_ code: BrokerError.Code) -> Int32 {
        switch code {
        case .notFound: return 4
        case .needsLogin: return 5
        case .unavailable, .busy: return 6
        case .forbidden: return 7
        case .locked: return 8
        default: return 1
        }
    }

    private static func hint(_ error: BrokerError) -> String {
        guard let wait = error.retryAfterMs else { return "" }
        return " (retry in \(max(1, wait / 1000)) s)"
    }
}

/// Reads a JSON document from a file, or from stdin for "-", so secrets never appear in argv.
enum SecretInput {
    static func read<T: Decodable>(_ source: String, as type: T.Type) throws -> T {
        let data: Data
        if source == "-" {
            data = FileHandle.standardInput.readDataToEndOfFile()
        } else {
            guard let contents = FileManager.default.contents(atPath: source) else {
                throw ValidationError("cannot read \(source)")
            }
            data = contents
        }
        do {
            return try Wire.makeDecoder().decode(T.self, from: data)
        } catch {
            throw ValidationError("\(source == "-" ? "stdin" : source) is not a JSON tokens object")
        }
    }
}

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the state of every account, or of one.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.") var account: String?

    func run() async throws {
        try await options.run({ StatusResult(accounts: try await $0.status(account: account)) }) { result in
            StatusTable.render(result.accounts, now: Date())
        }
    }
}

struct Token: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Print an access token (only the token), e.g. for curl -H \"Authorization: Bearer $(brokerctl token api)\"."
    )

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.") var account: String
    @Option(help: "Seconds the token must stay valid.") var minTTL: Double?

    func run() async throws {
        try await options.run({ try await $0.token(account: account, minTTL: minTTL) }) { $0.accessToken }
    }
}

struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show account events live (refreshed, refresh_failed, needs_login, logged_out, added, removed).")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Accounts to watch (all when none are given).") var accounts: [String] = []

    func run() async throws {
        try await options.run({ client in
            let events = try await client.events(accounts: accounts.isEmpty ? nil : accounts)
            for try await event in events {
                let line = options.json ? EventText.json(event) : EventText.human(event)
                FileHandle.standardOutput.write(Data((line + "\n").utf8))
            }
            return EmptyResult()
        }) { _ in "" }
    }
}

/// Nothing to print (`watch` prints as it goes).
struct EmptyResult: Encodable {}

/// How `watch` prints an event.
enum EventText {
    static func human(_ event: BrokerEvent) -> String {
        var text =
            "\(Wire.rfc3339(event.at))  \(event.event.rawValue.padding(toLength: 14, withPad: " ", startingAt: 0))  \(event.account)"
        if let expiresAt = event.expiresAt { text += "  expires \(Wire.rfc3339(expiresAt))" }
        if let message = event.message { text += "  \(message)" }
        return text
    }

    static func json(_ event: BrokerEvent) -> String {
        (try? Wire.makeEncoder().encode(event)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }
}

struct Add: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
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
    @OptionGroup var provider: ProviderOptions
    @Option(help: "File with the secrets as JSON, or - for stdin.") var secrets: String?

    func run() async throws {
        var spec = provider.spec
        var tokens: TokenSet?
        if let secrets {
            let input = try SecretInput.read(secrets, as: AddSecrets.self)
            spec["client_secret"] = input.clientSecret.map(JSONValue.string)
            tokens = input.tokens
        }
        try await options.run({ try await $0.add(account: account, provider: spec, tokens: tokens) }) {
            "added \($0.account) (\($0.state))"
        }
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

struct SetTokens: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Push new tokens into an account (clears needs_login).",
        discussion: "Reads a JSON tokens object from --from (a file, or - for stdin, the default).")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.") var account: String
    @Option(help: "File with the tokens as JSON, or - for stdin.") var from = "-"

    func run() async throws {
        let tokens = try SecretInput.read(from, as: TokenSet.self)
        try await options.run({ try await $0.setTokens(account: account, tokens: tokens) }) {
            "updated \($0.account) (\($0.state))"
        }
    }
}

struct Remove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Delete an account and its secrets.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.") var account: String

    func run() async throws {
        try await options.run({ try await $0.remove(account: account) }) { "removed \($0.account)" }
    }
}

struct Refresh: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Refresh an account now, ignoring its schedule.")

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.") var account: String

    func run() async throws {
        try await options.run({ try await $0.refresh(account: account) }) { "refreshed \($0.account) (\($0.state))" }
    }
}

struct Logout: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Revoke an account's credential at the IdP where it can be, then discard its tokens.",
        discussion: """
            The account and its settings stay (state logged_out) until new tokens are pushed with
            set-tokens. While the IdP cannot be reached, logout is refused and nothing is discarded,
            unless --force.
            """)

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.") var account: String
    @Flag(help: "Discard the credential even if the IdP cannot be reached to revoke it.") var force = false

    func run() async throws {
        try await options.run({ try await $0.logout(account: account, force: force) }) {
            "logged out \($0.account)" + ($0.revoked ? " (revoked at the IdP)" : " (discarded; not revoked at the IdP)")
        }
    }
}

struct Reload: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make the broker re-read broker.toml (a broken file is refused and changes nothing).")

    @OptionGroup var options: GlobalOptions

    func run() async throws {
        try await options.run({ try await $0.reload() }) { "reloaded (\($0.accounts) accounts)" }
    }
}

/// The human form of `status`.
enum StatusTable {
    static func render(_ accounts: [AccountStatus], now: Date) -> String {
        guard !accounts.isEmpty else { return "no accounts" }
        var rows = [["ACCOUNT", "PROVIDER", "STATE", "EXPIRES IN", "NEXT REFRESH", "LAST ERROR"]]
        for account in accounts {
            rows.append([
                account.account, account.provider, account.state.replacingOccurrences(of: "_", with: " "),
                account.expiresAt.map { duration($0.timeIntervalSince(now)) } ?? "-",
                account.nextRefreshAt.map { "in " + duration($0.timeIntervalSince(now)) } ?? "-",
                account.lastError?.message ?? "",
            ])
        }
        let widths = (0..<rows[0].count).map { column in rows.map { $0[column].count }.max() ?? 0 }
        return rows.map { row in
            zip(row, widths).map { $0.padding(toLength: $1, withPad: " ", startingAt: 0) }.joined(separator: "  ")
                .trimmingCharacters(in: .whitespaces)
        }.joined(separator: "\n")
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
