import BrokerProtocol
import FoundationEssentials

/// Why the broker refused or could not complete an operation: facts about the accounts, the
/// IdP and the vault. Its `description` is the sentence people read, in the log and in the
/// protocol error's message, saying what to do next in brokerctl terms; choosing the protocol
/// error's code is the server's job.
public enum BrokerFailure: Error, Sendable, Equatable, CustomStringConvertible {
    /// A value from outside breaks a rule; `reason` says which, for people.
    case invalid(String)
    /// No account has this name.
    case noSuchAccount(AccountName)
    /// `add` names an account that exists.
    case accountExists(AccountName)
    /// `setTokens` was given no access token, refresh token or refresh URL.
    case nothingToPush
    /// The account was logged out; only new tokens bring it back, as `restore` says.
    case loggedOut(AccountName, restore: Restoration)
    /// The IdP refused the account's credential; only new tokens bring it back, as `restore` says.
    /// `reason` is the refusal as the account's last error keeps it (the IdP's words).
    case denied(AccountName, reason: String?, restore: Restoration)
    /// The account never held the credential its kind refreshes with (`credential`, e.g.
    /// "refresh token"): no IdP was asked. `restore` says what supplies one.
    case noCredential(AccountName, credential: String, restore: Restoration)
    /// The IdP does not accept the account's client (`invalid_client`, `unauthorized_client`):
    /// its client settings are at fault, not its tokens; `reason` is what the IdP said, cleaned.
    /// `declared`: its client id and authentication come from broker.toml.
    case clientRejected(AccountName, reason: String, declared: Bool)
    /// A logout of the account is under way.
    case loggingOut(AccountName)
    /// A refresh was asked of an account whose tokens only a person supplies (kind `kind`).
    case neverRefreshes(AccountName, kind: String)
    /// A token was asked of such an account, and it holds none valid long enough.
    case noTokenLongEnough(AccountName, kind: String)
    /// The IdP or helper is failing; `reason` is what it last said (already cleaned).
    case refreshFailing(reason: String, retryAfter: TimeInterval)
    /// The account cannot start a refresh at this instant (another transition holds it).
    case refreshNotStarted(AccountName)
    /// A client's request would refresh the account within `minimumRefreshInterval` of the
    /// last refresh a client's request started, and the token held has expired; one may after
    /// `retryAfter` seconds.
    case refreshTooSoon(AccountName, retryAfter: TimeInterval)
    /// The caller started as many narrowed refreshes of the account as `NarrowedRefreshBudget`
    /// allows; one is back after `retryAfter` seconds.
    case narrowedRefreshesSpent(AccountName, retryAfter: TimeInterval)
    /// New tokens, a removal or a logout overtook the refresh the caller waited for.
    case changedDuringRefresh(AccountName)
    /// After a refresh, the token still falls short of `minTTL` (issued by the IdP, or held by
    /// the source of a kind that watches one).
    case tokenTooShort(heldBy: TokenSource, minTTL: TimeInterval)
    /// The IdP grants tokens of `lifetime`, shorter than `minTTL`: refreshing cannot help.
    case lifetimeTooShort(lifetime: TimeInterval, minTTL: TimeInterval)
    /// `logout` could not revoke the credential and discarded nothing. `retryAfter` is set when
    /// the failure may pass, `nil` when the account's settings are at fault.
    case revocationFailed(AccountName, reason: String, retryAfter: TimeInterval?)
    /// The vault could not be written; the log has the details.
    case vaultNotSaved
    /// No guarded memory could be mapped for a secret the operation needed (`SecretArena`).
    case outOfGuardedMemory
    /// The config file could not be read or parsed; nothing changed.
    case configUnreadable(reason: String)
    /// The config file's table for `account` cannot be applied; nothing changed.
    indirect case configNotApplied(account: String, because: BrokerFailure)
    /// The IdP refused a token of the account narrowed to a scope or bound to a resource
    /// (`TokenKey`); `reason` is what it said, already cleaned. The account is not affected.
    case targetRefused(AccountName, reason: String)
    /// The config would move a credential the account holds elsewhere (`move` says how).
    case credentialWouldMove(AccountName, move: String)

    /// A login ended without tokens for a reason only the user can fix (denied, expired, timed
    /// out, refused by the IdP); `reason` says which, already cleaned.
    case loginFailed(AccountName, reason: String)
    /// A login could not reach the IdP, or the IdP answered with an error or garbage.
    case loginUnavailable(reason: String)
    /// `login` names no account and gives no provider to create it with.
    case loginNeedsProvider(AccountName)
    /// `login` gives an existing account other settings than it has.
    case loginSettingsDiffer(AccountName)
    /// The account holds no id token: its IdP returned none.
    case noIDToken(AccountName)
    /// The account's record in the vault cannot be read by this release (`DamagedRecord`);
    /// `reason` names what, never a value.
    case damaged(AccountName, reason: String)
    /// The account's id token expires before the time asked for, and a refresh did not renew it.
    case idTokenExpired(AccountName)

    /// A shared account was asked of a broker whose broker.toml has no `[fleet]`.
    case noFleet
    /// The fleet's database could not be reached or refused the change; `reason` says why.
    case fleetUnavailable(reason: String)
    /// The account's share did not reach the fleet's database yet (`settleFleetMarks`): it
    /// serves its token but is not refreshed until the share is settled.
    case shareUnsettled(AccountName)

    /// The broker holds no vault key (passphrase mode): only `unlock` helps.
    case locked
    /// `unlock` was given a passphrase that does not open the vault.
    case wrongPassphrase
    /// Another unlock or rekey is deriving a key (or waiting out a wrong passphrase's delay).
    case keyDerivationRunning
    /// The vault cannot be opened or re-encrypted; `reason` says why (never a secret).
    case vaultUnusable(reason: String)

    /// Where a token that fell short came from.
    public enum TokenSource: Sendable, Equatable {
        /// An IdP or helper issued it to the broker.
        case issued
        /// The source of a kind that watches one (named `kind`) holds it.
        case watched(kind: String)
    }
}

extension BrokerFailure {
    /// The sentence for people: what happened and what to do, naming brokerctl commands (and
    /// the protocol op in brackets where a program would send one), never Swift values.
    public var description: String {
        switch self {
        case .invalid(let reason):
            return reason
        case .noSuchAccount(let name):
            return Self.noSuchAccount(name.rawValue)
        case .noFleet:
            return "this broker shares no accounts: its broker.toml has no [fleet] table (docs/fleet.md)"
        case .fleetUnavailable(let reason):
            return "the fleet's database cannot take the change now (\(reason)); try again"
        case .shareUnsettled(let name):
            return "\(name) is being shared and is not refreshed until the fleet's database has taken it; "
                + "brokerd finishes the share once the database answers (brokerctl fleet status)"
        case .accountExists(let name):
            return "an account named \(name) exists; remove it first (brokerctl remove \(name)) or push new tokens "
                + "to it with \(Self.setTokens(name))"
        case .nothingToPush:
            return "the tokens pushed need an access_token, a refresh_token or a refresh_url "
                + "(brokerctl set-tokens NAME reads them as JSON)"
        case .loggedOut(let name, let restore):
            return "\(name) is logged out; \(restore.sentence(for: name.rawValue))"
        case .denied(let name, let reason, let restore):
            return "the IdP denied the refresh for \(name)\(reason.map { ": \($0)" } ?? ""); "
                + restore.sentence(for: name.rawValue)
        case .noCredential(let name, let credential, let restore):
            return "\(name) has no \(credential) yet (no IdP was asked); \(restore.sentence(for: name.rawValue))"
        case .clientRejected(let name, let reason, let declared):
            return "\(reason): the IdP does not accept the client of \(name), so signing in again cannot help; "
                + Restoration.correctClient(declared: declared).sentence(for: name.rawValue)
        case .loggingOut(let name):
            return "\(name) is being logged out; wait for brokerctl logout \(name) to finish"
        case .neverRefreshes(let name, let kind):
            return "\(name) is a \(kind) account, which the broker does not refresh; push new tokens with "
                + Self.setTokens(name)
        case .noTokenLongEnough(let name, let kind):
            return "\(name) is a \(kind) account with no token valid long enough; push one with \(Self.setTokens(name))"
        case .refreshFailing(let reason, _):
            return "\(reason); the broker retries on its own (brokerctl status shows how it goes)"
        case .refreshNotStarted(let name):
            return "\(name) cannot be refreshed now; try again"
        case .changedDuringRefresh(let name):
            return "\(name) changed during the refresh; try again"
        case .refreshTooSoon(let name, _):
            return "\(name) was refreshed less than minimum_refresh_interval ago (broker.toml); try again later"
        case .narrowedRefreshesSpent(let name, _):
            return "this caller asked for more new scoped tokens of \(name) than the broker allows "
                + "(\(NarrowedRefreshBudget.burst) at once, then one every "
                + "\(Bounds.wholeSeconds(NarrowedRefreshBudget.refill)) s); try again later, or ask for a --scope "
                + "or --resource it already holds"
        case .outOfGuardedMemory:
            return "the broker is out of guarded memory for secrets; see its log (journalctl --user -u tokenbroker)"
        case .tokenTooShort(let source, let minTTL):
            let holder: String
            switch source {
            case .issued: holder = "the IdP issued"
            case .watched(let kind): holder = "the \(kind) holds"
            }
            return "\(holder) a token valid for less than min_ttl (\(Bounds.wholeSeconds(minTTL)) s); "
                + "ask for less with --min-ttl"
        case .lifetimeTooShort(let lifetime, let minTTL):
            return "the IdP issues tokens valid for \(Bounds.wholeSeconds(lifetime)) s, less than min_ttl "
                + "\(Bounds.wholeSeconds(minTTL)) s; ask for less with --min-ttl"
        case .revocationFailed(let name, let reason, let retryAfter):
            return "cannot revoke \(name) at the IdP (\(reason)); nothing was discarded. "
                + (retryAfter == nil ? "Check the account's settings, " : "Try again later, ")
                + "or brokerctl logout \(name) --force to discard it without revoking"
        case .targetRefused(let name, let reason):
            return "the IdP refused this scope or resource for \(name): \(reason); ask for another --scope or "
                + "--resource, or none"
        case .vaultNotSaved:
            return "the broker cannot save its vault; see its log (journalctl --user -u tokenbroker)"
        case .configUnreadable(let reason):
            return "config not reloaded: \(reason); fix broker.toml and run brokerctl reload"
        case .configNotApplied(let account, let because):
            return "config not applied: accounts.\(account): \(because)"
        case .credentialWouldMove(let name, let move):
            return "the account holds credentials and this \(move); log it out first (brokerctl logout \(name)) or "
                + "remove it (brokerctl remove \(name))"
        case .loginFailed(let name, let reason):
            return "\(reason); run brokerctl login \(name) again"
        case .loginUnavailable(let reason):
            return "\(reason); check the IdP's address (--issuer, --token-endpoint, or the account's issuer or "
                + "token_endpoint in broker.toml) or run brokerctl login again once the IdP is back"
        case .loginNeedsProvider(let name):
            return "no account \(name); give its provider: --issuer URL (or --token-endpoint ...) and --client-id"
        case .loginSettingsDiffer(let name):
            return "\(name) exists with other settings; brokerctl login \(name) without provider options signs in "
                + "with its own. To change them, edit its table in broker.toml and run brokerctl reload, or "
                + "brokerctl remove \(name) first"
        case .noIDToken(let name):
            return "\(name) holds no id token: its IdP returned none (ask for the openid scope with --scope)"
        case .damaged(let name, let reason):
            return "\(name) cannot be served: this brokerd cannot read its record in the vault (\(reason)); the record "
                + "is kept as it is. \(Restoration.removeDamaged.sentence(for: name.rawValue))"
        case .idTokenExpired(let name):
            return
                "the id token of \(name) expired and its IdP does not renew it on refresh; run brokerctl login \(name)"
        case .locked:
            return "the broker is locked; run brokerctl unlock"
        case .wrongPassphrase:
            return "wrong passphrase"
        case .keyDerivationRunning:
            return "another unlock or rekey is running; try again"
        case .vaultUnusable(let reason):
            return reason
        }
    }

    /// The message for an account named `name` that does not exist (nor may exist).
    public static func noSuchAccount(_ name: String) -> String {
        "no account named \(name); list them with brokerctl status"
    }

    /// The command that pushes tokens to `name`, with the op a program sends instead.
    private static func setTokens(_ name: AccountName) -> String {
        "brokerctl set-tokens \(name) (op set_tokens)"
    }
}
