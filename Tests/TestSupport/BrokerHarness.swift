import BrokerCore
import BrokerProtocol
import BrokerServer
import FoundationEssentials

/// The in-process broker harness: a `Broker` on a real vault in a temporary directory, talking
/// HTTP to a real token endpoint on 127.0.0.1, with a wall clock the test moves by hand.
public struct BrokerHarness: Sendable {
    public let directory: TemporaryDirectory
    public let idp: OAuth2TestIdP
    public let clock: TestClock
    public let logs: LogRecorder
    public let http: IdPClient
    public let broker: Broker
    public let keyPath: String
    public let vaultPath: String

    /// A fresh broker and IdP; `stop` shuts both down.
    public static func start(initialRefreshToken: String = "rt-0") async throws -> BrokerHarness {
        let directory = try TemporaryDirectory()
        let http = IdPClient(settings: BrokerSettings())
        do {
            let idp = try await OAuth2TestIdP(initialRefreshToken: initialRefreshToken)
            let keyPath = directory.file("config/vault.key")
            let vaultPath = directory.file("state/vault")
            let clock = TestClock()
            let logs = LogRecorder()
            do {
                let vault = try Vault(path: vaultPath, key: VaultKey.load(path: keyPath, create: true))
                let broker = try Broker(
                    vault: vault, settings: BrokerSettings(), http: http, clock: clock, logger: logs.logger())
                return BrokerHarness(
                    directory: directory, idp: idp, clock: clock, logs: logs, http: http, broker: broker,
                    keyPath: keyPath, vaultPath: vaultPath)
            } catch {
                await idp.shutdown()
                throw error
            }
        } catch {
            await http.shutdown()
            directory.remove()
            throw error
        }
    }

    /// Runs `body` against a fresh broker and IdP, then shuts both down.
    public static func run(
        initialRefreshToken: String = "rt-0", _ body: (BrokerHarness) async throws -> Void
    ) async throws {
        let harness = try await start(initialRefreshToken: initialRefreshToken)
        do {
            try await body(harness)
        } catch {
            await harness.stop()
            throw error
        }
        await harness.stop()
    }

    /// Waits for refreshes under way (their saves complete), then shuts the IdP client and the
    /// IdP down and removes the directory.
    public func stop() async {
        await broker.drain()
        await http.shutdown()
        await idp.shutdown()
        directory.remove()
    }

    /// An `oauth2` provider object pointing at the test IdP, with client_secret_basic.
    public var provider: ProviderSpec {
        ProviderSpec(
            kind: "oauth2",
            [
                "token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID),
                "client_secret": .string(idp.clientSecret), "client_auth": "client_secret_basic",
            ])
    }

    /// Adds `api` with an access token valid for an hour and refresh token `refreshToken`.
    public func addWithValidToken(_ accessToken: String = "at-pushed", refreshToken: String = "rt-0") async throws {
        _ = try await broker.add(
            account: "api", provider: provider,
            tokens: TokenSet(accessToken: accessToken, expiresIn: 3600, refreshToken: refreshToken))
    }

    /// The status of `account`.
    public func state(_ account: String = "api") async throws -> AccountStatus {
        guard let status = try await broker.status(account: account).first else {
            throw HarnessError("no status for \(account)")
        }
        return status
    }

    /// What a fresh copy of the vault holds, read with the broker's key.
    public func vaultCopy() throws -> VaultContents? {
        let copy = directory.file("copy-\(UUID().uuidString)/vault")
        let reader = try Vault(path: copy, key: VaultKey.load(path: keyPath, create: false))
        try copyVault(from: vaultPath, to: copy)
        return try reader.load()
    }
}

/// Copies the vault at `source` to `destination` as a restarted broker would find it: its
/// snapshot and, when there is one, its log.
public func copyVault(from source: String, to destination: String) throws {
    try FileManager.default.copyItem(atPath: source, toPath: destination)
    if FileManager.default.fileExists(atPath: source + ".log") {
        try FileManager.default.copyItem(atPath: source + ".log", toPath: destination + ".log")
    }
}
