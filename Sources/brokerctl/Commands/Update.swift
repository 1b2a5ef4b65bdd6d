import ArgumentParser
import BrokerClient
import BrokerProtocol

/// `brokerctl update NAME`: corrects an account in place (a wrong client secret, client id,
/// client authentication, endpoint or scope) without losing its refresh token, where `remove`
/// and `add` would lose it. The broker checks the result as `add` checks a new account.
struct Update: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "update",
        abstract:
            "Change an account's client id, client auth, client secret, endpoints or scope in place; its tokens stay.",
        discussion: """
            Only the options given change; --unset FIELD removes one (e.g. --unset scope). A new client \
            secret is read as {"client_secret": "..."} from --secrets (a file, or - for stdin), never from \
            the command line. The result is checked as add checks a new account. A change that would send \
            the account's refresh token to another client or IdP (another --client-id or --issuer, an \
            endpoint on another origin) is refused while the account holds one: brokerctl logout it first. \
            An account declared in broker.toml takes only a new client secret here (edit its table and run \
            brokerctl reload for the rest). An account the IdP had refused is refreshed again at once.
            """)

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @OptionGroup var provider: ProviderOptions
    @Option(help: "A field to remove (scope, revocation_endpoint, ...); repeat it for more.") var unset: [String] = []
    @Option(help: "File holding {\"client_secret\": ...}, or - for stdin.") var secrets: String?

    func run() throws {
        var changes = provider.spec(kind: "").fields
        for field in unset { changes[field] = .null }
        if let secrets {
            guard let secret = try SecretInput.read(secrets, option: "--secrets", as: AddSecrets.self).clientSecret
            else {
                StandardStream.error.write(
                    "brokerctl: --secrets: \(secrets == "-" ? "stdin" : secrets) holds no client_secret\n")
                throw ExitCode(ExitStatus.dataError)
            }
            changes["client_secret"] = .string(secret)
        }
        guard !changes.isEmpty else { throw ValidationError("give a setting to change, --unset FIELD or --secrets") }
        try options.run(.update(account: account, changes: changes)) { "updated \($0.account) (\($0.state))" }
    }
}
