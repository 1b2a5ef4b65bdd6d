import BrokerCore
import BrokerProtocol
import FoundationEssentials

/// The broker's operations as the protocol states them: request fields in, wire results out,
/// failures as protocol errors. Each one translates (`WireTranslation`) and calls the engine;
/// none touches the actor's state, so none runs on it (a `token` call that waited for a refresh
/// does not queue on the actor again to return its answer).
extension Broker {
    /// `token`: a token of `account` valid for `minTTL` seconds.
    public nonisolated func token(account: String, minTTL: TimeInterval) async throws(BrokerError) -> PreparedToken {
        let name = try WireTranslation.existingAccountName(account)
        return try await translating { () async throws(BrokerFailure) in try await token(for: name, minTTL: minTTL) }
    }

    /// `reject`: a token to use instead of `accessToken`, which a resource server refused.
    public nonisolated func reject(account: String, accessToken: String, minTTL: TimeInterval) async throws(BrokerError)
        -> PreparedToken
    {
        let name = try WireTranslation.existingAccountName(account)
        return try await translating { () async throws(BrokerFailure) in
            try await reject(accessToken, of: name, minTTL: minTTL)
        }
    }

    /// `status`: one account, or every account when `account` is `nil`.
    public nonisolated func status(account: String?) async throws(BrokerError) -> [AccountStatus] {
        guard let account else { return await snapshots().map(WireTranslation.status) }
        let name = try WireTranslation.existingAccountName(account)
        return [
            WireTranslation.status(
                try await translating { () async throws(BrokerFailure) in try await snapshot(of: name) })
        ]
    }

    /// `add`.
    public nonisolated func add(account: String?, provider: ProviderSpec?, tokens: TokenSet?) async throws(BrokerError)
        -> AccountResult
    {
        let name = try WireTranslation.accountName(account)
        let (config, clientSecret) = try WireTranslation.provider(provider)
        let push = try tokens.map { tokens throws(BrokerError) in try WireTranslation.tokenPush(tokens) }
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in
                try await add(name, provider: config, clientSecret: clientSecret, tokens: push)
            })
    }

    /// `set_tokens`.
    public nonisolated func setTokens(account: String?, tokens: TokenSet?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        let push = try tokens.map { tokens throws(BrokerError) in try WireTranslation.tokenPush(tokens) }
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in
                try await setTokens(of: name, to: push ?? TokenPush())
            }
        )
    }

    /// `remove`.
    public nonisolated func remove(account: String?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        try await translating { () async throws(BrokerFailure) in try await remove(name) }
        return AccountResult(account: name.rawValue, state: "removed")
    }

    /// `refresh`.
    public nonisolated func refreshNow(account: String?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in try await refreshNow(name) })
    }

    /// `logout`.
    public nonisolated func logout(account: String?, force: Bool) async throws(BrokerError) -> LogoutResult {
        let name = try WireTranslation.accountName(account)
        let outcome = try await translating { () async throws(BrokerFailure) in try await logout(name, force: force) }
        return LogoutResult(account: name.rawValue, state: "logged_out", revoked: outcome == .revoked)
    }

    /// `reload`.
    public nonisolated func reload() async throws(BrokerError) -> ReloadResult {
        let count = try await translating { () async throws(BrokerFailure) in try await reloadConfiguration() }
        return ReloadResult(reloaded: true, accounts: count)
    }

    /// The result of `body`, or the protocol error for its failure.
    private nonisolated func translating<Result>(_ body: () async throws(BrokerFailure) -> Result)
        async throws(BrokerError)
        -> Result
    {
        do {
            return try await body()
        } catch {
            throw BrokerError(error)
        }
    }
}
