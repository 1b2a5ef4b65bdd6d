import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// The broker's operations as the protocol states them: request fields in, wire results out,
/// failures as protocol errors. Each one translates (`WireTranslation`) and calls the engine;
/// none touches the actor's state, so none runs on it (a `token` call that waited for a refresh
/// does not queue on the actor again to return its answer). The engine knows nothing of the
/// wire: its operations take and return domain values, and this is where requests meet them.
public struct WireOperations: Sendable {
    /// The engine the operations run on.
    public let broker: Broker

    public init(_ broker: Broker) { self.broker = broker }

    /// `token`: a token of `account` valid for `minTTL` seconds, narrowed to `scope` and bound
    /// to `resource` when they are given, for a caller of uid `caller` (by default the broker's
    /// own, the owner's), whose budget such narrowed refreshes draw on.
    public func token(
        account: String, minTTL: TimeInterval, scope: String? = nil, resource: String? = nil,
        caller: UInt32 = getuid()
    ) async throws(BrokerError) -> PreparedToken {
        let name = try WireTranslation.existingAccountName(account)
        let key = try WireTranslation.tokenKey(scope: scope, resource: resource)
        return try await translating { () async throws(BrokerFailure) in
            try await broker.token(for: name, key: key, minTTL: minTTL, caller: caller)
        }
    }

    /// `reject`: a token to use instead of `accessToken`, which a resource server refused;
    /// `scope` and `resource` name the token as `token` did, for a caller of uid `caller` as there.
    public func reject(
        account: String, accessToken: String, minTTL: TimeInterval, scope: String? = nil, resource: String? = nil,
        caller: UInt32 = getuid()
    ) async throws(BrokerError) -> PreparedToken {
        let name = try WireTranslation.existingAccountName(account)
        let key = try WireTranslation.tokenKey(scope: scope, resource: resource)
        return try await translating { () async throws(BrokerFailure) in
            try await broker.reject(try SecretBytes(accessToken), of: name, key: key, minTTL: minTTL, caller: caller)
        }
    }

    /// `status`: one account, or every account when `account` is `nil`.
    public func status(account: String?) async throws(BrokerError) -> [AccountStatus] {
        if broker.padlock.isLocked { return try lockedStatus(account: account) }
        guard let account else {
            return await broker.snapshots().map {
                WireTranslation.status($0, bridges: broker.bridges.of($0.name.rawValue))
            }
        }
        let name = try WireTranslation.existingAccountName(account)
        return [
            WireTranslation.status(
                try await translating { () async throws(BrokerFailure) in try await broker.snapshot(of: name) },
                bridges: broker.bridges.of(account))
        ]
    }

    /// `add`; with `shared`, in the fleet's shared store.
    public func add(account: String?, provider: ProviderSpec?, tokens: TokenSet?, shared: Bool = false)
        async throws(BrokerError) -> AccountResult
    {
        let name = try WireTranslation.accountName(account)
        let (config, clientSecret) = try WireTranslation.provider(provider)
        let push = try tokens.map { tokens throws(BrokerError) in try WireTranslation.tokenPush(tokens) }
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in
                shared
                    ? try await broker.addShared(name, provider: config, clientSecret: clientSecret, tokens: push)
                    : try await broker.add(name, provider: config, clientSecret: clientSecret, tokens: push)
            })
    }

    /// `set_tokens`.
    public func setTokens(account: String?, tokens: TokenSet?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        let push = try tokens.map { tokens throws(BrokerError) in try WireTranslation.tokenPush(tokens) }
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in
                try await broker.setTokens(of: name, to: push ?? TokenPush())
            }
        )
    }

    /// `update`: `changes` holds provider fields, and perhaps the client secret.
    public func update(account: String?, changes: [String: JSONValue]?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        guard var changes else { throw BrokerError(.badRequest, "the field \"changes\" is required") }
        let secret = changes.removeValue(forKey: "client_secret")
        guard secret == nil || secret?.text != nil else {
            throw BrokerError(.badRequest, "\"client_secret\" must be a string")
        }
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in
                try await broker.update(
                    name, changes: changes, clientSecret: try secret?.text.map(SecretBytes.init))
            })
    }

    /// `remove`.
    public func remove(account: String?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        try await translating { () async throws(BrokerFailure) in try await broker.remove(name) }
        return AccountResult(account: name.rawValue, state: "removed")
    }

    /// `share`: a local account into the fleet's shared store.
    public func share(account: String?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in try await broker.share(name) })
    }

    /// `unshare`: a shared account out of the fleet's store, into this broker's vault.
    public func unshare(account: String?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in try await broker.unshare(name) })
    }

    /// `fleet_status`.
    public func fleetStatus() async throws(BrokerError) -> FleetStatusResult {
        WireTranslation.fleetStatus(
            try await translating { () async throws(BrokerFailure) in try await broker.fleetStatus() })
    }

    /// `refresh`.
    public func refreshNow(account: String?) async throws(BrokerError) -> AccountResult {
        let name = try WireTranslation.accountName(account)
        return WireTranslation.result(
            try await translating { () async throws(BrokerFailure) in try await broker.refreshNow(name) })
    }

    /// `logout`.
    public func logout(account: String?, force: Bool) async throws(BrokerError) -> LogoutResult {
        let name = try WireTranslation.accountName(account)
        let outcome = try await translating { () async throws(BrokerFailure) in
            try await broker.logout(name, force: force)
        }
        return LogoutResult(account: name.rawValue, state: "logged_out", revoked: outcome == .revoked)
    }

    /// `token` with `"id_token": true`: the id token of `account`, with the expiry its payload states.
    public func idToken(account: String, minTTL: TimeInterval) async throws(BrokerError) -> IDTokenResult {
        let name = try WireTranslation.existingAccountName(account)
        let held = try await translating { () async throws(BrokerFailure) in
            try await broker.idToken(for: name, minTTL: minTTL)
        }
        let now = broker.clock.now()
        return IDTokenResult(
            account: name.rawValue, idToken: held.idToken.text, expiresAt: held.expiresAt,
            expiresIn: held.expiresAt.map { Bounds.wholeSeconds(max(0, $0.timeIntervalSince(now))) })
    }

    /// `login`: signs the user in at the account's IdP with the request's flow; `progress`
    /// receives what to show them. `peerPID` is the connecting process, whose descriptors
    /// alone a `secrets_file` under /proc may name.
    public func login(
        _ request: Request, peerPID: Int32, progress: @escaping @Sendable (LoginProgress) async -> Void
    ) async throws(BrokerError) -> LoginResult {
        let name = try WireTranslation.accountName(request.account)
        let options = try WireTranslation.loginOptions(request)
        var fileSecret: String?
        if let path = request.secretsFile {
            fileSecret = try await translating { () async throws(BrokerFailure) in
                try await SecretsFile.clientSecret(at: path, peerPID: peerPID)
            }
        }
        var clientSecret: SecretBytes?
        do {
            clientSecret = try fileSecret.map(SecretBytes.init)
        } catch {
            throw BrokerError(error)
        }
        var provider: ProviderConfig?
        if var spec = request.provider {
            if let fileSecret {
                guard spec["client_secret"] == nil else {
                    throw BrokerError(
                        .badRequest, "give the client secret in \"secrets_file\" or in \"provider\", not both")
                }
                spec["client_secret"] = .string(fileSecret)
            }
            do {
                (provider, clientSecret) = try WireTranslation.provider(spec)
            } catch {
                // Options that are no whole provider (`login NAME --client-id X`) cannot be an
                // existing account's settings: say that, not which field a new one would need.
                if (try? await broker.snapshot(of: name)) != nil { throw BrokerError(.loginSettingsDiffer(name)) }
                throw error
            }
        }
        let outcome = try await translating { [clientSecret, provider] () async throws(BrokerFailure) in
            try await broker.login(
                name, provider: provider, clientSecret: clientSecret, options: options, progress: progress)
        }
        return LoginResult(
            account: name.rawValue, state: outcome.snapshot.state.rawValue, idToken: outcome.hasIDToken)
    }

    /// `reload`.
    public func reload() async throws(BrokerError) -> ReloadResult {
        let count = try await translating { () async throws(BrokerFailure) in try await broker.reloadConfiguration() }
        return ReloadResult(reloaded: true, accounts: count)
    }

    /// The result of `body`, or the protocol error for its failure.
    private func translating<Result>(_ body: () async throws(BrokerFailure) -> Result)
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
