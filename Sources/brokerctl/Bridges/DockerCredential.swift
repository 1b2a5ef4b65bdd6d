import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

/// `brokerctl docker-credential get|store|erase|list|version`, also run as
/// `docker-credential-tokenbroker`: the protocol of docker-credential-helpers for the accounts
/// whose `[accounts.NAME.docker] registries` list the registry docker asks about. docker reads
/// a failed helper's standard output as the error, so failures are written there.
struct DockerCredential: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "docker-credential",
        abstract: "docker's credential helper: \"credHelpers\" or \"credsStore\": \"tokenbroker\".",
        discussion: """
            get reads a registry on stdin and answers {"ServerURL", "Username", "Secret"} (the
            access token) for the account whose [accounts.NAME.docker] registries list it (an
            http:// URL only for a loopback registry or one listed in allow_http); list
            maps each served registry to its user name; store does nothing; erase of a served
            registry makes its next get refresh the token; version prints a line.
            """)

    /// What docker-credential-helpers answers for a registry it holds nothing for; docker
    /// recognises this text.
    static let notFound = "credentials not found in native keychain"
    /// Largest input read (a server URL, or store's small JSON object).
    static let maximumSize = 64 * 1024

    @OptionGroup var options: BridgeOptions
    @Argument(help: "get, store, erase, list or version.") var operation: String

    func run() throws {
        do {
            switch operation {
            case "get":
                let serverURL = try readServerURL()
                let (account, docker) = try serving(serverURL)
                let token = try options.token(of: account.account)
                let answer = ["ServerURL": serverURL, "Username": docker.username, "Secret": token.accessToken]
                StandardStream.output.write(try Self.json(answer) + "\n")
            case "erase":
                let (account, _) = try serving(try readServerURL())
                guard DockerBridge.erasesToken(refreshedAt: account.lastRefreshAt, now: Date()) else { return }
                let current = try options.token(of: account.account)
                _ = try options.client().perform(
                    .reject(account: account.account, accessToken: current.accessToken, minTTL: options.minTTL))
            case "list":
                var served: [String: String] = [:]
                for account in try options.accounts() {
                    for registry in account.docker?.registries ?? [] where served[registry] == nil {
                        served[registry] = account.docker?.username
                    }
                }
                StandardStream.output.write(try Self.json(served) + "\n")
            case "store":
                guard BoundedInput.read(limit: Self.maximumSize) != nil else {
                    throw BridgeFailure("the credentials are larger than \(Self.maximumSize / 1024) KiB")
                }
            case "version":
                StandardStream.output.write("docker-credential-tokenbroker (tokenbroker) \(Release.version)\n")
            default:
                throw BridgeFailure("unknown operation \(operation) (known: get, store, erase, list, version)")
            }
        } catch let failure as BridgeFailure {
            StandardStream.output.write(failure.description + "\n")
            throw ExitCode(.failure)
        } catch let error as ConnectionError {
            StandardStream.output.write("brokerctl: \(error)\n")
            throw ExitCode(.failure)
        } catch let error as BrokerError {
            StandardStream.output.write("brokerctl: \(error.message)\n")
            throw ExitCode(.failure)
        }
    }

    /// `object` as one line of JSON, keys sorted, `/` unescaped (as docker's helpers write it).
    private static func json(_ object: [String: String]) throws -> String {
        String(decoding: try Wire.makeEncoder().encode(object), as: UTF8.self)
    }

    /// The server URL on stdin (docker writes it without a newline; one is allowed).
    private func readServerURL() throws -> String {
        guard var bytes = BoundedInput.read(limit: Self.maximumSize) else {
            throw BridgeFailure("the server URL is larger than \(Self.maximumSize / 1024) KiB")
        }
        while let last = bytes.last, last == UInt8(ascii: "\n") || last == UInt8(ascii: "\r") { bytes.removeLast() }
        guard !bytes.isEmpty else { throw BridgeFailure("no server URL on stdin") }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The account serving the registry `serverURL` names, and its docker settings;
    /// `notFound` when no account does. A bearer token crosses plain http only to a loopback
    /// registry or one an account lists in `allow_http` (docs/bridges.md): `get` of an
    /// `http://` URL of any other registry an account serves is `notFound`, with a warning on stderr.
    private func serving(_ serverURL: String) throws -> (account: AccountStatus, docker: DockerBridge) {
        guard let registry = BridgeNames.registry(serverURL) else { throw BridgeFailure(Self.notFound) }
        let host = String(registry.prefix { $0 != "/" })
        let plainHTTP =
            operation == "get" && serverURL.lowercased().hasPrefix("http://")
            && !LoopbackHost.contains(hostAndPort: host)
        var refused: String?
        for account in try options.accounts() {
            guard let docker = account.docker, docker.registries.contains(registry) else { continue }
            if !plainHTTP || docker.allowHTTP?.contains(registry) == true { return (account, docker) }
            refused = refused ?? account.account
        }
        if let refused {
            StandardStream.error.write(
                "brokerctl: not sending the token of \(refused) to http://\(registry): plain http shows it to the "
                    + "network; use https, or list the registry in allow_http of [accounts.\(refused).docker]\n")
        }
        throw BridgeFailure(Self.notFound)
    }
}
