@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerServer
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// `WireTranslation` on its own: request fields refused with the protocol's texts, and every
/// domain failure turned into its code, text (with the brokerctl advice) and retry hint.
@Suite struct WireTranslationTests {
    // MARK: Requests

    @Test(arguments: [
        (nil, "the field \"account\" is required"),
        ("", "the field \"account\" is required"),
        ("a b", "account names are 1-128 characters of A-Z a-z 0-9 . _ - @"),
        ("tête", "account names are 1-128 characters of A-Z a-z 0-9 . _ - @"),
        (String(repeating: "a", count: 129), "account names are 1-128 characters of A-Z a-z 0-9 . _ - @"),
    ])
    func badAccountNamesAreBadRequests(name: String?, message: String) {
        let error = #expect(throws: BrokerError.self) { try WireTranslation.accountName(name) }
        #expect(error?.code == .badRequest)
        #expect(error?.message == message)
    }

    @Test func everyAllowedCharacterMakesAName() throws {
        let text = "AZaz09._-@" + String(repeating: "x", count: 118)
        #expect(try WireTranslation.accountName(text).rawValue == text)
    }

    @Test func aNameNoAccountMayHaveIsNotFoundForClientOps() {
        let error = #expect(throws: BrokerError.self) { try WireTranslation.existingAccountName("a b") }
        #expect(error?.code == .notFound)
        #expect(error?.message == "no account named a b; list them with brokerctl status")
    }

    @Test func aMissingOrUnknownProviderIsABadRequest() {
        let missing = #expect(throws: BrokerError.self) { try WireTranslation.provider(nil) }
        #expect(missing?.code == .badRequest)
        #expect(missing?.message == "the field \"provider\" is required")
        let unknown = #expect(throws: BrokerError.self) {
            try WireTranslation.provider(ProviderSpec(kind: "kerberos"))
        }
        #expect(unknown?.code == .badRequest)
        #expect(
            unknown?.message
                == "unknown provider kind \"kerberos\"; use oauth2, refresh_url, sliding, exec, file or static")
    }

    @Test(arguments: [
        (TokenSet(accessToken: ""), "\"access_token\" is empty"),
        (TokenSet(accessToken: "at", expiresIn: .nan), "\"expires_in\" must be a finite number of seconds"),
        (TokenSet(accessToken: "at", expiresIn: .infinity), "\"expires_in\" must be a finite number of seconds"),
        (TokenSet(accessToken: "at one"), "\"access_token\" must be printable ASCII (it goes into HTTP headers)"),
        (
            TokenSet(accessToken: "at", tokenType: ""),
            "\"token_type\" must be printable ASCII (it goes into HTTP headers)"
        ),
        (
            TokenSet(accessToken: "at", idToken: "a\nb"),
            "\"id_token\" must be printable ASCII (it goes into HTTP headers)"
        ),
        (TokenSet(accessToken: "at", scope: "a\"b"), "\"scope\" must be printable ASCII (it goes into HTTP headers)"),
        (
            {
                var tokens = TokenSet(refreshToken: "rt")
                tokens.refreshExpiresIn = -.infinity
                return tokens
            }(), "\"refresh_expires_in\" must be a finite number of seconds"
        ),
    ])
    func badPushedTokensAreBadRequests(tokens: TokenSet, message: String) {
        let error = #expect(throws: BrokerError.self) { try WireTranslation.tokenPush(tokens) }
        #expect(error?.code == .badRequest)
        #expect(error?.message == message)
    }

    @Test func pushedLifetimesAndDatesAreBounded() throws {
        let cut = try WireTranslation.tokenPush(TokenSet(accessToken: "at", expiresIn: 1e300, refreshToken: "rt"))
        #expect(cut.access?.expiry == .after(Bounds.maximumLifetime))
        #expect(cut.access?.type == "Bearer")
        #expect(cut.refreshExpiry == nil)
        let expired = try WireTranslation.tokenPush(TokenSet(accessToken: "at", expiresIn: -30))
        #expect(expired.access?.expiry == .after(-30))
        var dated = TokenSet(accessToken: "at", expiresIn: 60, expiresAt: Date(timeIntervalSince1970: 1e15))
        dated.refreshToken = "rt"
        dated.refreshExpiresIn = 7200
        let push = try WireTranslation.tokenPush(dated)
        #expect(push.access?.expiry == .at(Bounds.representableDates.upperBound), "the date wins, within range")
        #expect(push.refreshExpiry == .after(7200))
        #expect(push.refreshToken == "rt")
    }

    // MARK: Failures

    static let api = try! AccountName("api")

    @Test(
        arguments: [
            (BrokerFailure.invalid("\"path\" must be a string"), "bad_request", "\"path\" must be a string", nil),
            (.noSuchAccount(api), "not_found", "no account named api; list them with brokerctl status", nil),
            (
                .accountExists(api), "bad_request",
                "an account named api exists; remove it first (brokerctl remove api) or push new tokens to it with "
                    + "brokerctl set-tokens api (op set_tokens)", nil
            ),
            (
                .nothingToPush, "bad_request",
                "the tokens pushed need an access_token, a refresh_token or a refresh_url (brokerctl set-tokens NAME "
                    + "reads them as JSON)", nil
            ),
            (
                .loggedOut(api, restore: .push(field: "access_token", noSignIn: false)), "needs_login",
                "api is logged out; push a new access_token with brokerctl set-tokens api (op set_tokens), which reads "
                    + #"{"access_token": ...} as JSON"#, nil
            ),
            (
                .denied(api, reason: nil, restore: .push(field: "refresh_token", noSignIn: true)), "needs_login",
                "the IdP denied the refresh for api; push a new refresh_token with brokerctl set-tokens api (op "
                    + #"set_tokens), which reads {"refresh_token": ...} as JSON; its IdP offers no sign-in endpoint "#
                    + "(brokerctl update api --authorization-endpoint URL or --device-authorization-endpoint URL adds "
                    + "one)", nil
            ),
            (
                .noCredential(api, credential: "refresh token", restore: .signIn(flow: .device)), "needs_login",
                "api has no refresh token yet (no IdP was asked); sign in with brokerctl login api --flow device", nil
            ),
            (
                .noCredential(api, credential: "refresh URL", restore: .push(field: "refresh_url", noSignIn: false)),
                "needs_login",
                "api has no refresh URL yet (no IdP was asked); push a new refresh_url with brokerctl set-tokens api "
                    + #"(op set_tokens), which reads {"refresh_url": ...} as JSON"#, nil
            ),
            (
                .clientRejected(
                    api, reason: "the IdP refused the code exchange: HTTP 401 (invalid_client)", declared: false),
                "needs_login",
                "the IdP refused the code exchange: HTTP 401 (invalid_client): the IdP does not accept the client of "
                    + "api, so signing in again cannot help; correct the client secret with brokerctl update api "
                    + #"--secrets -, which reads {"client_secret": ...} as JSON (--client-id and --client-auth change "#
                    + "the others)", nil
            ),
            (
                .loggedOut(api, restore: .signIn(flow: nil)), "needs_login",
                "api is logged out; sign in with brokerctl login api", nil
            ),
            (
                .denied(api, reason: "HTTP 400 (invalid_grant: unknown refresh token)", restore: .askCommandAgain),
                "needs_login",
                "the IdP denied the refresh for api: HTTP 400 (invalid_grant: unknown refresh token); sign in with the "
                    + "command's own tool, then ask it again with brokerctl refresh api", nil
            ),
            (
                .loggingOut(api), "unavailable", "api is being logged out; wait for brokerctl logout api to finish",
                1000
            ),
            (
                .neverRefreshes(api, kind: "static"), "bad_request",
                "api is a static account, which the broker does not refresh; push new tokens with brokerctl set-tokens "
                    + "api (op set_tokens)", nil
            ),
            (
                .noTokenLongEnough(api, kind: "static"), "needs_login",
                "api is a static account with no token valid long enough; push one with brokerctl set-tokens api "
                    + "(op set_tokens)", nil
            ),
            (
                .refreshFailing(reason: "HTTP 503", retryAfter: 1.5), "unavailable",
                "HTTP 503; the broker retries on its own (brokerctl status shows how it goes)", 1500
            ),
            (.refreshNotStarted(api), "unavailable", "api cannot be refreshed now; try again", 0),
            (.changedDuringRefresh(api), "unavailable", "api changed during the refresh; try again", 0),
            (
                .tokenTooShort(heldBy: .issued, minTTL: 600.9), "lifetime_too_short",
                "the IdP issued a token valid for less than min_ttl (600 s); ask for less with --min-ttl", nil
            ),
            (
                .tokenTooShort(heldBy: .watched(kind: "file"), minTTL: 60), "unavailable",
                "the file holds a token valid for less than min_ttl (60 s); ask for less with --min-ttl", nil
            ),
            (
                .lifetimeTooShort(lifetime: 300, minTTL: 7200), "lifetime_too_short",
                "the IdP issues tokens valid for 300 s, less than min_ttl 7200 s; ask for less with --min-ttl", nil
            ),
            (
                .revocationFailed(api, reason: "HTTP 503", retryAfter: 2), "unavailable",
                "cannot revoke api at the IdP (HTTP 503); nothing was discarded. Try again later, or brokerctl logout api "
                    + "--force to discard it without revoking", 2000
            ),
            (
                .revocationFailed(api, reason: "HTTP 400", retryAfter: nil), "unavailable",
                "cannot revoke api at the IdP (HTTP 400); nothing was discarded. Check the account's settings, or brokerctl "
                    + "logout api --force to discard it without revoking", nil
            ),
            (
                .vaultNotSaved, "internal",
                "the broker cannot save its vault; see its log (journalctl --user -u tokenbroker)", nil
            ),
            (
                .configUnreadable(reason: "line 3: expected ="), "bad_request",
                "config not reloaded: line 3: expected =; fix broker.toml and run brokerctl reload", nil
            ),
            (
                .configNotApplied(account: "a b", because: .invalid("account names are 1-128 characters")),
                "bad_request",
                "config not applied: accounts.a b: account names are 1-128 characters", nil
            ),
            (
                .configNotApplied(
                    account: "api", because: .credentialWouldMove(api, move: "changes its kind from oauth2 to exec")),
                "bad_request",
                "config not applied: accounts.api: the account holds credentials and this changes its kind from oauth2 to "
                    + "exec; log it out first (brokerctl logout api) or remove it (brokerctl remove api)", nil
            ),
        ] as [(BrokerFailure, String, String, Int?)])
    func everyFailureHasItsCodeTextAndRetryHint(failure: BrokerFailure, code: String, message: String, retry: Int?) {
        let error = BrokerError(failure)
        #expect(error.code.rawValue == code)
        #expect(error.message == message)
        #expect(error.retryAfterMs == retry)
        // The log shows the same sentence, never the Swift value (`credentialWouldMove(api, ...)`).
        #expect("\(failure)" == message)
    }

    // MARK: Results

    @Test func aSnapshotBecomesAStatusEntryAndAResult() {
        let at = Date(timeIntervalSince1970: 1_800_000_000)
        let lastError = AccountError(code: "unavailable", message: "HTTP 503", at: at)
        let snapshot = AccountSnapshot(
            name: Self.api, kind: "oauth2", state: .needsLogin, expiresAt: at, refreshExpiresAt: at + 1,
            nextRefreshAt: at + 2, lastRefreshAt: at + 3, lastError: lastError)
        #expect(
            WireTranslation.status(snapshot)
                == AccountStatus(
                    account: "api", provider: "oauth2", state: "needs_login", expiresAt: at, refreshExpiresAt: at + 1,
                    nextRefreshAt: at + 2, lastRefreshAt: at + 3, lastError: lastError))
        #expect(WireTranslation.result(snapshot) == AccountResult(account: "api", state: "needs_login"))
    }

    @Test(arguments: [
        (AccountEvent.Kind.refreshed, BrokerEvent.Kind.refreshed), (.refreshFailed, .refreshFailed),
        (.needsLogin, .needsLogin), (.loggedOut, .loggedOut), (.added, .added), (.removed, .removed),
    ])
    func anEventKeepsItsKindAndFields(kind: AccountEvent.Kind, wire: BrokerEvent.Kind) {
        let at = Date(timeIntervalSince1970: 1_800_000_000)
        let event = AccountEvent(
            kind: kind, account: Self.api, at: at, state: .loggedOut, message: "why", expiresAt: at + 60)
        #expect(
            WireTranslation.event(event)
                == BrokerEvent(
                    event: wire, account: "api", at: at, state: "logged_out", message: "why", expiresAt: at + 60))
        let removed = AccountEvent(kind: .removed, account: Self.api, at: at)
        #expect(WireTranslation.event(removed).state == nil)
    }
}
