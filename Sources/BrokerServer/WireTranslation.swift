import BrokerCore
import BrokerProtocol
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
                refreshURL: try tokens.refreshURL.map(SecretBytes.init))
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
        AccountStatus(
            account: snapshot.name.rawValue, provider: snapshot.kind, state: snapshot.state.rawValue,
            expiresAt: snapshot.expiresAt, refreshExpiresAt: snapshot.refreshExpiresAt,
            nextRefreshAt: snapshot.nextRefreshAt, lastRefreshAt: snapshot.lastRefreshAt, lastError: snapshot.lastError,
            git: bridges?.git, docker: bridges?.docker, lostScope: snapshot.lostScope?.joined(separator: " "))
    }

    /// The result of an owner op that changed an account.
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
        BrokerError(.notFound, "no account named \(name); list them with brokerctl status")
    }

    /// What brings back account `name` whose tokens are gone: signing in again for an account
    /// that signs in, pushing tokens for the others.
    static func restoration(of name: AccountName, signsIn: Bool) -> String {
        signsIn ? "sign in again with brokerctl login \(name)" : "push new tokens with brokerctl set-tokens \(name)"
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
    /// The protocol error for `failure`, with what to do about it.
    public init(_ failure: BrokerFailure) {
        switch failure {
        case .invalid(let reason):
            self.init(.badRequest, reason)
        case .noSuchAccount(let name):
            self = WireTranslation.noSuchAccount(name.rawValue)
        case .accountExists(let name):
            self.init(.badRequest, "an account named \(name) exists; remove it first or use set_tokens")
        case .nothingToPush:
            self.init(.badRequest, "\"tokens\" needs an access_token, a refresh_token or a refresh_url")
        case .loggedOut(let name, let signsIn):
            self.init(.needsLogin, "\(name) is logged out; \(WireTranslation.restoration(of: name, signsIn: signsIn))")
        case .denied(let name, let signsIn):
            self.init(
                .needsLogin,
                "the IdP denied the refresh for \(name); \(WireTranslation.restoration(of: name, signsIn: signsIn))")
        case .loggingOut(let name):
            self.init(.unavailable, "\(name) is being logged out", retryAfterMs: 1000)
        case .neverRefreshes(let name, let kind):
            self.init(.badRequest, "\(name) is a \(kind) account; push new tokens with set_tokens")
        case .noTokenLongEnough(let name, let kind):
            self.init(
                .needsLogin, "\(name) is a \(kind) account with no token valid long enough; push one with set_tokens")
        case .refreshFailing(let reason, let retryAfter):
            self.init(.unavailable, reason, retryAfterMs: Bounds.milliseconds(retryAfter))
        case .refreshNotStarted(let name):
            self.init(.unavailable, "\(name) cannot be refreshed now; try again", retryAfterMs: 0)
        case .refreshTooSoon(let name, let retryAfter):
            self.init(
                .busy, "\(name) was refreshed less than minimum_refresh_interval ago; try again later",
                retryAfterMs: max(1, Bounds.milliseconds(retryAfter)))
        case .narrowedRefreshesSpent(let name, let retryAfter):
            self.init(
                .busy,
                "this caller asked for more new scoped tokens of \(name) than the broker allows "
                    + "(\(NarrowedRefreshBudget.burst) at once, then one every "
                    + "\(Bounds.wholeSeconds(NarrowedRefreshBudget.refill)) s); try again later",
                retryAfterMs: max(1, Bounds.milliseconds(retryAfter)))
        case .changedDuringRefresh(let name):
            self.init(.unavailable, "\(name) changed during the refresh; try again", retryAfterMs: 0)
        case .tokenTooShort(let source, let minTTL):
            let holder: String
            switch source {
            case .issued: holder = "the IdP issued"
            case .watched(let kind): holder = "the \(kind) holds"
            }
            self.init(
                .unavailable, "\(holder) a token valid for less than min_ttl (\(Bounds.wholeSeconds(minTTL)) s)")
        case .lifetimeTooShort(let lifetime, let minTTL):
            self.init(
                .unavailable,
                "the IdP issues tokens valid for \(Bounds.wholeSeconds(lifetime)) s, less than min_ttl "
                    + "\(Bounds.wholeSeconds(minTTL)) s")
        case .revocationFailed(let name, let reason, let retryAfter):
            self.init(
                .unavailable,
                "cannot revoke \(name) at the IdP (\(reason)); nothing was discarded. "
                    + (retryAfter == nil ? "Check the account's settings, " : "Try again later, ")
                    + "or brokerctl logout \(name) --force to discard it without revoking",
                retryAfterMs: retryAfter.map(Bounds.milliseconds))
        case .targetRefused(let name, let reason):
            self.init(.forbidden, "the IdP refused this scope or resource for \(name): \(reason)")
        case .vaultNotSaved:
            self.init(.internal, "the broker cannot save its vault; see its log")
        case .outOfGuardedMemory:
            self.init(.internal, "the broker is out of guarded memory for secrets")
        case .configUnreadable(let reason):
            self.init(.badRequest, "config not reloaded: \(reason)")
        case .configNotApplied(let account, let because):
            self.init(.badRequest, "config not applied: accounts.\(account): \(BrokerError(because).message)")
        case .loginFailed(let name, let reason):
            self.init(.needsLogin, "\(reason); run brokerctl login \(name) again")
        case .loginUnavailable(let reason):
            self.init(.unavailable, reason)
        case .loginRunning(let name):
            self.init(.busy, "a login of \(name) is already running; finish or cancel it first")
        case .loginNeedsProvider(let name):
            self.init(
                .notFound,
                "no account \(name); give its provider: --issuer URL (or --token-endpoint ...) and --client-id")
        case .loginSettingsDiffer(let name):
            self.init(
                .badRequest,
                "\(name) exists with other settings; brokerctl login restores it with its own settings "
                    + "(remove it first to change them)")
        case .noIDToken(let name):
            self.init(.notFound, "\(name) holds no id token: its IdP returned none")
        case .idTokenExpired(let name):
            self.init(
                .needsLogin,
                "the id token of \(name) expired and its IdP does not renew it on refresh; run brokerctl login \(name)")
        case .credentialWouldMove(let name, let move):
            self.init(
                .badRequest,
                "the account holds credentials and this \(move); log it out first (brokerctl logout \(name)) or "
                    + "remove it (brokerctl remove \(name))")
        case .locked:
            self.init(.locked, "the broker is locked; run brokerctl unlock")
        case .wrongPassphrase:
            self.init(.forbidden, "wrong passphrase")
        case .keyDerivationRunning:
            self.init(.busy, "another unlock or rekey is running; try again", retryAfterMs: 1000)
        case .vaultUnusable(let reason):
            self.init(.internal, reason)
        }
    }
}
