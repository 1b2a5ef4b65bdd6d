import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

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
