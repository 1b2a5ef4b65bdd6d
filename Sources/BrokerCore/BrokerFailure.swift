import FoundationEssentials

/// Why the broker refused or could not complete an operation: facts about the accounts, the
/// IdP and the vault. Turning them into protocol errors, with advice on what to do next, is
/// the server's job.
public enum BrokerFailure: Error, Sendable, Equatable {
    /// A value from outside breaks a rule; `reason` says which, for people.
    case invalid(String)
    /// No account has this name.
    case noSuchAccount(AccountName)
    /// `add` names an account that exists.
    case accountExists(AccountName)
    /// `setTokens` was given no access token, refresh token or refresh URL.
    case nothingToPush
    /// The account was logged out; only new tokens bring it back (a sign-in when `signsIn`).
    case loggedOut(AccountName, signsIn: Bool)
    /// The IdP refused the account's credential; only new tokens bring it back (a sign-in when
    /// `signsIn`).
    case denied(AccountName, signsIn: Bool)
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
    /// A login of the account is already running.
    case loginRunning(AccountName)
    /// `login` names no account and gives no provider to create it with.
    case loginNeedsProvider(AccountName)
    /// `login` gives an existing account other settings than it has.
    case loginSettingsDiffer(AccountName)
    /// The account holds no id token: its IdP returned none.
    case noIDToken(AccountName)
    /// The account's id token expires before the time asked for, and a refresh did not renew it.
    case idTokenExpired(AccountName)

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
