import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// Where the protocol meets the broker's domain: request fields become checked domain values
/// (refused with the texts the protocol states), and domain results and failures become wire
/// results and protocol errors, with the brokerctl advice people need next.
public enum WireTranslation {
    // MARK: Requests

    /// The account an owner op names: required, and a name an account may have.
    public static func accountName(_ text: String?) throws(BrokerError) -> AccountName {
        let text = try required(text)
        do {
            return try AccountName(text)
        } catch {
            throw BrokerError(error)
        }
    }

    /// The account a client op (`token`, `reject`, `status`) names. A name no account may have
    /// names no account: such a request is answered as one for an account that does not exist.
    public static func existingAccountName(_ text: String) throws(BrokerError) -> AccountName {
        guard let name = try? AccountName(text) else { throw noSuchAccount(text) }
        return name
    }

    /// A `provider` object: required, and checked with its kind's rules.
    public static func provider(_ spec: ProviderSpec?) throws(BrokerError) -> (
        ProviderConfig, clientSecret: SecretBytes?
    ) {
        guard let spec else { throw BrokerError(.badRequest, "the field \"provider\" is required") }
        do {
            return try ProviderConfig.checking(spec)
        } catch {
            throw BrokerError(error)
        }
    }

    /// A `tokens` object: lifetimes finite (cut to ±`Bounds.maximumLifetime`), dates within
    /// `Bounds.representableDates`, an access token fit for HTTP headers.
    public static func tokenPush(_ tokens: TokenSet) throws(BrokerError) -> TokenPush {
        do {
            let access = try tokens.accessToken.map { value throws(BrokerFailure) in
                try TokenPush.Access(
                    value: value, type: tokens.tokenType,
                    expiry: try expiry(at: tokens.expiresAt, after: tokens.expiresIn, "expires_in"),
                    idToken: tokens.idToken, scope: tokens.scope)
            }
            return TokenPush(
                access: access, refreshToken: try tokens.refreshToken.map(SecretBytes.init),
                refreshExpiry: try expiry(
                    at: tokens.refreshExpiresAt, after: tokens.refreshExpiresIn, "refresh_expires_in"),
                refreshURL: try tokens.refreshURL.map(SecretBytes.init),
                clientSecret: try tokens.clientSecret.map(SecretBytes.init))
        } catch {
            throw BrokerError(error)
        }
    }

    /// The token a `token` or `reject` request asks for: its `scope` and `resource`, checked.
    public static func tokenKey(scope: String?, resource: String?) throws(BrokerError) -> TokenKey {
        do {
            return try TokenKey.checking(scope: scope, resource: resource)
        } catch {
            throw BrokerError(error)
        }
    }

    /// The `flow`, `redirect_port` and `timeout` of a `login` request, checked.
    public static func loginOptions(_ request: Request) throws(BrokerError) -> LoginOptions {
        guard let text = request.flow else {
            throw BrokerError(.badRequest, "the field \"flow\" is required: device or browser")
        }
        guard let flow = LoginFlow(rawValue: text) else {
            throw BrokerError(.badRequest, "\"flow\" is device or browser")
        }
        if let port = request.redirectPort, !(1...65535).contains(port) {
            throw BrokerError(.badRequest, "\"redirect_port\" must be 1 to 65535")
        }
        if let timeout = request.timeout, !(timeout.isFinite && LoginOptions.timeouts.contains(timeout)) {
            let range = LoginOptions.timeouts
            throw BrokerError(
                .badRequest,
                "\"timeout\" must be \(Int(range.lowerBound)) to \(Int(range.upperBound)) seconds")
        }
        return LoginOptions(flow: flow, redirectPort: request.redirectPort, timeout: request.timeout)
    }

    // MARK: Results

    /// An account's entry in `status`, with the git hosts and registries it serves.
    public static func status(_ snapshot: AccountSnapshot, bridges: AccountBridges? = nil) -> AccountStatus {
        var status = AccountStatus(
            account: snapshot.name.rawValue, provider: snapshot.kind, state: snapshot.state.rawValue,
            expiresAt: snapshot.expiresAt, refreshExpiresAt: snapshot.refreshExpiresAt,
            nextRefreshAt: snapshot.nextRefreshAt, lastRefreshAt: snapshot.lastRefreshAt, lastError: snapshot.lastError,
            git: bridges?.git, docker: bridges?.docker, lostScope: snapshot.lostScope?.joined(separator: " "))
        if let shared = snapshot.shared {
            status.shared = true
            status.version = shared.version
            status.lastRefreshedBy = shared.lastRefreshedBy
            status.leaseHolder = shared.leaseHolder
        }
        status.dpop = snapshot.dpop.map {
            DPoPKeyStatus(algorithm: $0.algorithm, thumbprint: $0.thumbprint, issuedTokenType: $0.otherTokenType)
        }
        status.advice = snapshot.restoration?.sentence(for: snapshot.name.rawValue)
        status.adviceCommand = snapshot.restoration?.command(for: snapshot.name.rawValue)
        return status
    }

    /// The result of an owner op that changed an account.
    /// `fleet_status`'s answer from what the engine saw of the fleet.
    public static func fleetStatus(_ standing: FleetStanding) -> FleetStatusResult {
        switch standing.report {
        case .success(let report):
            return FleetStatusResult(
                host: standing.host, reachable: true, schema: report.schema, sharedAccounts: standing.sharedAccounts,
                hosts: report.hosts.map { FleetHost(host: $0.name, seenSecondsAgo: $0.seenSecondsAgo) },
                leases: report.leases.map {
                    FleetLease(account: $0.account, holder: $0.holder, secondsLeft: $0.secondsLeft)
                })
        case .failure(let error):
            return FleetStatusResult(
                host: standing.host, reachable: false, reason: error.description,
                sharedAccounts: standing.sharedAccounts)
        }
    }

    public static func result(_ snapshot: AccountSnapshot) -> AccountResult {
        AccountResult(account: snapshot.name.rawValue, state: snapshot.state.rawValue)
    }

    /// An event line's fields.
    public static func event(_ event: AccountEvent) -> BrokerEvent {
        let kind: BrokerEvent.Kind
        switch event.kind {
        case .refreshed: kind = .refreshed
        case .refreshFailed: kind = .refreshFailed
        case .needsLogin: kind = .needsLogin
        case .loggedOut: kind = .loggedOut
        case .added: kind = .added
        case .removed: kind = .removed
        case .valid: kind = .valid
        }
        return BrokerEvent(
            event: kind, account: event.account.rawValue, at: event.at, state: event.state?.rawValue,
            message: event.message, expiresAt: event.expiresAt)
    }

    // MARK: Helpers

    private static func required(_ text: String?) throws(BrokerError) -> String {
        guard let text, !text.isEmpty else { throw BrokerError(.badRequest, "the field \"account\" is required") }
        return text
    }

    /// The answer for an account named `name` that does not exist.
    static func noSuchAccount(_ name: String) -> BrokerError {
        BrokerError(.notFound, BrokerFailure.noSuchAccount(name))
    }

    /// A pushed token's expiry: the date if given, else the lifetime `seconds` (named `field`)
    /// if given. A lifetime must be finite even beside a date.
    private static func expiry(at date: Date?, after seconds: Double?, _ field: String) throws(BrokerFailure)
        -> TokenPush.Expiry?
    {
        let lifetime = try seconds.map { seconds throws(BrokerFailure) in
            guard let lifetime = Bounds.lifetime(abs(seconds)) else {
                throw .invalid("\"\(field)\" must be a finite number of seconds")
            }
            return seconds < 0 ? -lifetime : lifetime
        }
        if let date { return .at(Bounds.date(date)) }
        return lifetime.map { .after($0) }
    }
}

extension BrokerError {
    /// The protocol error for `failure`: its code and retry hint, with the failure's sentence
    /// (which says what to do about it) as the message.
    public init(_ failure: BrokerFailure) {
        let message = failure.description
        switch failure {
        case .invalid, .accountExists, .nothingToPush, .neverRefreshes, .configUnreadable, .configNotApplied,
            .loginSettingsDiffer, .credentialWouldMove, .noFleet:
            self.init(.badRequest, message)
        case .noSuchAccount, .loginNeedsProvider, .noIDToken:
            self.init(.notFound, message)
        case .damaged:
            self.init(.damaged, message)
        case .loggedOut, .denied, .noCredential, .clientRejected, .noTokenLongEnough, .loginFailed, .idTokenExpired:
            self.init(.needsLogin, message)
        case .loggingOut:
            self.init(.unavailable, message, retryAfterMs: 1000)
        case .refreshTooSoon(_, let retryAfter), .narrowedRefreshesSpent(_, let retryAfter):
            self.init(.busy, message, retryAfterMs: max(1, Bounds.milliseconds(retryAfter)))
        case .outOfGuardedMemory:
            self.init(.internal, message)
        case .keyDerivationRunning:
            self.init(.busy, message, retryAfterMs: 1000)
        case .refreshFailing(_, let retryAfter):
            self.init(.unavailable, message, retryAfterMs: Bounds.milliseconds(retryAfter))
        case .refreshNotStarted, .changedDuringRefresh:
            self.init(.unavailable, message, retryAfterMs: 0)
        case .tokenTooShort(.issued, _), .lifetimeTooShort:
            self.init(.lifetimeTooShort, message)
        case .tokenTooShort(.watched, _), .loginUnavailable:
            self.init(.unavailable, message)
        case .fleetUnavailable, .shareUnsettled:
            self.init(.unavailable, message, retryAfterMs: 1000)
        case .revocationFailed(_, _, let retryAfter):
            self.init(.unavailable, message, retryAfterMs: retryAfter.map(Bounds.milliseconds))
        case .targetRefused, .wrongPassphrase:
            self.init(.forbidden, message)
        case .vaultNotSaved, .vaultUnusable:
            self.init(.internal, message)
        case .locked:
            self.init(.locked, message)
        }
    }
}
