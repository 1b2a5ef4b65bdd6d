import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerServer
import BrokerVault
import FoundationEssentials

/// The in-process broker harness: a `Broker` on a real vault in a temporary directory, reaching
/// a test IdP served in process (`InProcessIdPTransport`: no socket), with a wall clock the test
/// moves by hand.
public struct BrokerHarness: Sendable {
    public let directory: TemporaryDirectory
    public let idp: OAuth2TestIdP
    public let clock: TestClock
    public let logs: LogRecorder
    public let settings: BrokerSettings
    public let http: IdPClient
    public let broker: Broker
    public let keyPath: String
    public let vaultPath: String

    /// A fresh broker with `settings`, and an IdP whose first refresh token is
    /// `initialRefreshToken`; the vault holds `vault` before the broker starts on it (empty when
    /// `nil`), in `stateDirectory` (by default one in the harness's directory). `stop` shuts both down.
    public static func start(
        initialRefreshToken: String = "rt-0", settings: BrokerSettings = BrokerSettings(), vault: VaultContents? = nil,
        stateDirectory: String? = nil
    ) async throws -> BrokerHarness {
        let directory = try TemporaryDirectory()
        let http = IdPClient.inProcess(settings: settings)
        do {
            let idp = try await OAuth2TestIdP(initialRefreshToken: initialRefreshToken, serving: .inProcess)
            let keyPath = directory.file("config/vault.key")
            let vaultPath = (stateDirectory ?? directory.file("state")) + "/vault"
            let clock = TestClock()
            idp.judgeDevices(on: clock)
            let logs = LogRecorder()
            do {
                let key = try VaultKey.load(path: keyPath, create: true)
                if let vault { try Vault(path: vaultPath, key: key).save(vault) }
                let broker = try Broker(
                    vault: Vault(path: vaultPath, key: key), settings: settings, http: http, clock: clock,
                    logger: logs.logger())
                return BrokerHarness(
                    directory: directory, idp: idp, clock: clock, logs: logs, settings: settings, http: http,
                    broker: broker, keyPath: keyPath, vaultPath: vaultPath)
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

    /// Runs `body` against a fresh broker and IdP (see `start`), then shuts both down.
    public static func run(
        initialRefreshToken: String = "rt-0", settings: BrokerSettings = BrokerSettings(), vault: VaultContents? = nil,
        stateDirectory: String? = nil, _ body: (BrokerHarness) async throws -> Void
    ) async throws {
        let harness = try await start(
            initialRefreshToken: initialRefreshToken, settings: settings, vault: vault, stateDirectory: stateDirectory)
        try await runThenStop(harness, stop: { await $0.stop() }, body)
    }

    /// Waits for refreshes under way (their saves complete), then shuts the IdP client and the
    /// IdP down and removes the directory.
    public func stop() async {
        await broker.drain()
        await http.shutdown()
        await idp.shutdown()
        directory.remove()
    }

    /// A second broker, as a restart would find the vault now: on a copy of it (the first broker
    /// keeps its lock), with the same settings and clock, and the same IdP client unless `http`
    /// is given (a new one knows nothing the first learnt, as after a real restart; the caller
    /// shuts it down).
    public func restart(http: IdPClient? = nil) throws -> Broker {
        try Broker(
            vault: copyOfVault(), settings: settings, http: http ?? self.http, clock: clock, logger: logs.logger())
    }

    /// Opens `answers` once the IdP holds a request and the broker has taken one more turn, so
    /// that the requests started before it have joined the refresh under way: what an answer's
    /// delay gave them, without guessing a time.
    public func openOnceJoined(_ answers: AnswerGate) async throws {
        await answers.holding(1)
        _ = try await broker.status(account: nil)
        answers.open()
    }

    /// An `oauth2` provider object pointing at the test IdP, with client_secret_basic.
    public var provider: ProviderSpec { idp.provider(clientAuth: "client_secret_basic") }

    /// Adds `api` with an access token valid for an hour and refresh token `refreshToken`.
    public func addWithValidToken(_ accessToken: String = "at-pushed", refreshToken: String = "rt-0") async throws {
        _ = try await broker.add(
            account: "api", provider: provider,
            tokens: TokenSet(accessToken: accessToken, expiresIn: 3600, refreshToken: refreshToken))
    }

    /// Whether `account`, denied, stays quiet: a day passes on the clock, the due refreshes run
    /// and a client asks for a token, and `calls` (the IdP's, or the command's runs) stays the same.
    public func staysQuietAfterDenial(_ account: String, calls: () -> Int) async -> Bool {
        let before = calls()
        clock.advance(by: 86_400)
        let next = await broker.runDueRefreshes()
        let asked = try? await broker.token(account: account, minTTL: 1)
        await broker.drain()
        return next == nil && asked == nil && calls() == before
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
        try copyOfVault().load()
    }

    /// A fresh copy of the vault as it is on disk now, opened with the broker's key.
    private func copyOfVault() throws -> Vault {
        let copy = directory.file("copy-\(UUID().uuidString)/vault")
        let vault = try Vault(path: copy, key: VaultKey.load(path: keyPath, create: false))
        try copyVault(from: vaultPath, to: copy)
        return vault
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
