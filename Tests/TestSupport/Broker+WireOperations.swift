import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerServer
import BrokerVault
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// The protocol's operations (`WireOperations`) called on an engine, as the tests of those
/// operations over the engine do: request fields in, wire results and protocol errors out.
extension Broker {
    private var operations: WireOperations { WireOperations(self) }

    public nonisolated func token(
        account: String, minTTL: TimeInterval, scope: String? = nil, resource: String? = nil,
        caller: UInt32 = getuid()
    ) async throws(BrokerError) -> PreparedToken {
        try await operations.token(account: account, minTTL: minTTL, scope: scope, resource: resource, caller: caller)
    }

    public nonisolated func reject(
        account: String, accessToken: String, minTTL: TimeInterval, scope: String? = nil, resource: String? = nil,
        caller: UInt32 = getuid()
    ) async throws(BrokerError) -> PreparedToken {
        try await operations.reject(
            account: account, accessToken: accessToken, minTTL: minTTL, scope: scope, resource: resource,
            caller: caller)
    }

    public nonisolated func status(account: String?) async throws(BrokerError) -> [AccountStatus] {
        try await operations.status(account: account)
    }

    public nonisolated func add(account: String?, provider: ProviderSpec?, tokens: TokenSet?, shared: Bool = false)
        async throws(BrokerError) -> AccountResult
    {
        try await operations.add(account: account, provider: provider, tokens: tokens, shared: shared)
    }

    public nonisolated func setTokens(account: String?, tokens: TokenSet?) async throws(BrokerError) -> AccountResult {
        try await operations.setTokens(account: account, tokens: tokens)
    }

    public nonisolated func remove(account: String?) async throws(BrokerError) -> AccountResult {
        try await operations.remove(account: account)
    }

    public nonisolated func refreshNow(account: String?) async throws(BrokerError) -> AccountResult {
        try await operations.refreshNow(account: account)
    }

    public nonisolated func logout(account: String?, force: Bool) async throws(BrokerError) -> LogoutResult {
        try await operations.logout(account: account, force: force)
    }

    public nonisolated func idToken(account: String, minTTL: TimeInterval) async throws(BrokerError) -> IDTokenResult {
        try await operations.idToken(account: account, minTTL: minTTL)
    }

    public nonisolated func login(
        _ request: Request, peerPID: Int32, progress: @escaping @Sendable (LoginProgress) async -> Void
    ) async throws(BrokerError) -> LoginResult {
        try await operations.login(request, peerPID: peerPID, progress: progress)
    }

    public nonisolated func reload() async throws(BrokerError) -> ReloadResult { try await operations.reload() }

    public nonisolated func unlock(passphrase: String?) async throws(BrokerError) -> LockResult {
        try await operations.unlock(passphrase: passphrase)
    }

    public nonisolated func lockVault() async throws(BrokerError) -> LockResult { try await operations.lockVault() }

    public nonisolated func rekey(to: String?, passphrase: String?) async throws(BrokerError) -> RekeyResult {
        try await operations.rekey(to: to, passphrase: passphrase)
    }
}
