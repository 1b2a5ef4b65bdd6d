import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

/// `brokerctl git-credential get|store|erase`, also run as `git-credential-tokenbroker`: git's
/// credential helper protocol (gitcredentials(7), git-credential(1)) for the accounts whose
/// `[accounts.NAME.git] hosts` list the host git asks about.
struct GitCredential: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "git-credential",
        abstract: "git's credential helper: git config credential.helper tokenbroker.",
        discussion: """
            get answers username, password (the access token) and password_expiry_utc for the
            account whose [accounts.NAME.git] hosts list the host (authtype=Bearer and credential
            when git offers capability[]=authtype); a host no account serves gets an empty answer,
            as does plain http to a host that is not loopback or listed in allow_http.
            store does nothing; erase of the current token makes the next get refresh it.
            When get finds an oauth2 account that needs a login (not one logged out) and someone
            can sign in (a display or a terminal, GIT_TERMINAL_PROMPT not 0), it starts the
            account's sign-in, or joins the one open, and answers once it is done; --no-login
            (credential.helper "tokenbroker --no-login") answers at once instead.
            """)

    @OptionGroup var options: BridgeOptions
    @Flag(help: "Never start or join a sign-in for an account that needs a login; fail at once.")
    var noLogin = false
    @Argument(help: "get, store or erase (git's operation; others are ignored).") var operation: String

    func run() throws {
        guard operation == "get" || operation == "erase" else {
            // store keeps nothing: the broker is the store. Unknown operations are ignored, as
            // gitcredentials(7) asks of helpers.
            _ = BoundedInput.read(limit: GitCredentialInput.maximumSize)
            return
        }
        let input: GitCredentialInput
        do {
            input = try GitCredentialInput.read()
        } catch {
            StandardStream.error.write("brokerctl: \(error)\n")
            throw ExitCode(.failure)
        }
        try GlobalOptions.reportingFailures {
            guard let (account, username) = try serving(input) else { return }
            if operation == "erase" {
                // Only the broker's own token is reported: a password another helper gave is not sent.
                let refused = input.values["password"] ?? input.values["credential"]
                if let refused, try options.token(of: account).accessToken == refused {
                    _ = try options.client().perform(
                        .reject(account: account, accessToken: refused, minTTL: options.minTTL))
                }
                return
            }
            let token: TokenResult
            if noLogin || !BridgeLogin.userReachable {
                token = try options.token(of: account)
            } else {
                token = try BridgeLogin.token(of: account, options: options)
            }
            StandardStream.output.write(answer(token, username: username, to: input))
        }
    }

    /// The account serving the host of `input`, and its user name; `nil` for a host (or a
    /// protocol, or a user name) no account serves. A bearer token crosses plain http only to a
    /// loopback host or one an account lists in `allow_http` (docs/bridges.md): `get` for any
    /// other host an account serves over https is refused with a warning on stderr.
    private func serving(_ input: GitCredentialInput) throws -> (account: String, username: String)? {
        guard let scheme = input.values["protocol"], scheme == "https" || scheme == "http",
            let host = input.values["host"].flatMap(BridgeNames.host)
        else { return nil }
        let candidates = try options.accounts().filter { account in
            guard let git = account.git, git.hosts.contains(host) else { return false }
            // A user name in the URL (https://me@host/) asks for that identity only.
            return input.values["username"].map { $0 == git.username } ?? true
        }
        let plainHTTP = scheme == "http" && !LoopbackHost.contains(hostAndPort: host)
        let account = candidates.first { !plainHTTP || $0.git?.allowHTTP?.contains(host) == true }
        guard let account, let git = account.git else {
            if let refused = candidates.first, operation == "get" {
                StandardStream.error.write(
                    "brokerctl: not sending the token of \(refused.account) to http://\(host): plain http shows it "
                        + "to the network; use https, or list the host in allow_http of [accounts.\(refused.account).git]\n"
                )
            }
            return nil
        }
        return (account.account, git.username)
    }

    /// The lines `get` writes: `authtype`/`credential` when git offered `capability[]=authtype`
    /// (git 2.46+), else `username`/`password`; then `password_expiry_utc` (Unix seconds).
    private func answer(_ token: TokenResult, username: String, to input: GitCredentialInput) -> String {
        let expiry = "password_expiry_utc=\(Bounds.wholeSeconds(token.expiresAt.timeIntervalSince1970))\n"
        guard input.capabilities.contains("authtype") else {
            return "username=\(username)\npassword=\(token.accessToken)\n" + expiry
        }
        // ephemeral: git must not hand this credential to storing helpers; it expires.
        return "capability[]=authtype\nauthtype=\(token.tokenType)\ncredential=\(token.accessToken)\nephemeral=1\n"
            + expiry
    }
}

/// What git writes to a helper: `key=value` lines up to a blank line or the end of input.
struct GitCredentialInput {
    /// Largest input read (git sends a few hundred bytes; a token may be a few KiB).
    static let maximumSize = 256 * 1024
    /// Most lines read.
    static let maximumLines = 256

    /// Single-valued keys, the last one given winning, as git reads them.
    var values: [String: String] = [:]
    /// The `capability[]` values git offered.
    var capabilities: Set<String> = []

    /// Reads standard input; refuses input that is too long or holds NUL or control characters.
    static func read() throws -> GitCredentialInput {
        guard let bytes = BoundedInput.read(limit: maximumSize) else {
            throw BridgeFailure("the credential description is larger than \(maximumSize / 1024) KiB")
        }
        return try parse(bytes)
    }

    static func parse(_ bytes: [UInt8]) throws -> GitCredentialInput {
        var input = GitCredentialInput()
        let lines = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
        for (number, line) in lines.enumerated() {
            if line.isEmpty { break }
            guard number < maximumLines else {
                throw BridgeFailure("the credential description has more than \(maximumLines) lines")
            }
            guard line.allSatisfy({ $0 >= 0x20 && $0 != 0x7F }) else {
                throw BridgeFailure("line \(number + 1) of the credential description holds a control character")
            }
            guard let equals = line.firstIndex(of: UInt8(ascii: "=")) else {
                throw BridgeFailure("line \(number + 1) of the credential description is not key=value")
            }
            let key = String(decoding: line[..<equals], as: UTF8.self)
            let value = String(decoding: line[(equals + 1)...], as: UTF8.self)
            if key == "capability[]" {
                input.capabilities.insert(value)
            } else if !key.hasSuffix("[]") {
                input.values[key] = value
            }
        }
        return input
    }
}
