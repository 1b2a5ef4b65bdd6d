@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
import BrokerServer
@testable import BrokerVault
import Foundation
import NIOHTTP1
import Synchronization
import Testing
import TestSupport

/// `login` against the test IdP (in process), the test playing the user: the device flow
/// (RFC 8628), the browser flow (PKCE and a loopback redirect), what a login creates, restores
/// and stores, and how it ends when the user denies, waits too long or goes away. The waits of
/// a login (poll intervals, timeouts) are on the harness's clock, which the test moves; apart
/// from BrokerCoreTests since the browser flow opens the broker's own listener on 127.0.0.1.
@Suite struct LoginTests {
    /// The progress a login reported, in order.
    final class Progress: Sendable {
        private let events = Mutex<[LoginProgress]>([])

        var all: [LoginProgress] { events.withLock { $0 } }

        @Sendable func record(_ progress: LoginProgress) async { events.withLock { $0.append(progress) } }

        /// The first progress of `kind`, waiting for it.
        func first(_ kind: LoginProgress.Kind) async throws -> LoginProgress {
            // Generous: the whole suite's processes and key derivations share two cores with it.
            guard await eventually(timeout: 60, { all.contains { $0.event == kind } }),
                let found = all.first(where: { $0.event == kind })
            else { throw HarnessError("no \(kind) progress") }
            return found
        }
    }

    /// An `oauth2` provider with the test IdP's issuer (endpoints discovered) and client secret.
    static func provider(_ idp: OAuth2TestIdP, scope: String = "openid offline_access", secret: Bool = true)
        -> ProviderSpec
    {
        var spec = ProviderSpec(
            kind: "oauth2",
            ["issuer": .string(idp.issuer), "client_id": .string(idp.clientID), "scope": .string(scope)])
        if secret { spec["client_secret"] = .string(idp.clientSecret) }
        return spec
    }

    static func request(
        _ flow: String, provider: ProviderSpec? = nil, account: String = "work", timeout: Double? = nil,
        secretsFile: String? = nil, redirectPort: Int? = nil
    ) -> Request {
        Request(
            id: .integer(1), op: "login", account: account, provider: provider, flow: flow, secretsFile: secretsFile,
            redirectPort: redirectPort, timeout: timeout)
    }

    /// Runs `request` on the broker in a task of its own.
    static func start(_ harness: BrokerHarness, _ request: Request, progress: Progress) -> Task<LoginResult, any Error>
    {
        Task { try await harness.broker.login(request, peerPID: getpid(), progress: progress.record) }
    }

    /// Starts a device login of a new account "work" at the harness's IdP, polled every second.
    static func startDeviceLogin(_ harness: BrokerHarness, timeout: Double? = nil) -> (
        Task<LoginResult, any Error>, Progress
    ) {
        harness.idp.setDeviceTiming(interval: 1)
        let progress = Progress()
        let login = start(
            harness, request("device", provider: provider(harness.idp), timeout: timeout), progress: progress)
        return (login, progress)
    }

    /// Starts a browser login of a new account "work" at the harness's IdP and waits for the
    /// authorization URL it reports.
    static func startBrowserLogin(_ harness: BrokerHarness, timeout: Double? = nil) async throws -> (
        Task<LoginResult, any Error>, LoginProgress
    ) {
        let progress = Progress()
        let login = start(
            harness, request("browser", provider: provider(harness.idp), timeout: timeout), progress: progress)
        return (login, try await progress.first(.authorizationURL))
    }

    /// Lets `count` polls of the running device login happen: each time, waits until it sleeps
    /// on the harness's clock for its interval (or less, to its timeout), and moves the clock to
    /// the end of that sleep; the 180 s of a browser login running beside it do not pass.
    static func poll(_ harness: BrokerHarness, times count: Int = 1) async {
        for _ in 0..<count { await harness.clock.advanceToNextWake(within: 10) }
    }

    static func failure(_ task: Task<LoginResult, any Error>) async -> BrokerError? {
        do {
            _ = try await task.value
            return nil
        } catch {
            return error as? BrokerError
        }
    }

    static func accountExists(_ harness: BrokerHarness, _ name: String = "work") async -> Bool {
        (try? await harness.broker.status(account: name)) != nil
    }

    static func port(of redirectURI: String?) throws -> Int {
        try #require(URLComponents(string: redirectURI ?? "")?.port)
    }

    // MARK: Device flow

    @Test func deviceFlowApprovedCreatesTheAccountAndItsRefreshPresentsTheStoredRefreshToken() async throws {
        try await BrokerHarness.run { harness in
            let (login, progress) = Self.startDeviceLogin(harness)
            let offer = try await progress.first(.deviceCode)
            #expect(offer.userCode?.count == 9)
            #expect(offer.verificationURI == harness.idp.tokenEndpoint.replacing("/token", with: "/device"))
            #expect(offer.interval == 1 && offer.expiresIn == 600)
            // The user takes a while: the broker hears authorization_pending meanwhile, a second apart.
            await Self.poll(harness, times: 2)
            await harness.clock.sleepersReached(1)
            let pending = harness.idp.devicePolls
            #expect(pending.count == 2 && pending[1].timeIntervalSince(pending[0]) == 1)
            #expect(!(await Self.accountExists(harness)))
            let complete = try #require(offer.verificationURIComplete)
            #expect(try await harness.idp.decide(.approve, at: complete) == 200)
            await Self.poll(harness)

            let result = try await login.value
            #expect(result == LoginResult(account: "work", state: "valid", idToken: true))
            let token = try await harness.broker.token(account: "work", minTTL: 60)
            #expect(harness.idp.issuedAccessTokens == [token.result.accessToken])
            let stored = try #require(try harness.vaultCopy()?.accounts.first { $0.name == "work" })
            #expect(stored.secrets.refreshToken?.text == harness.idp.issuedRefreshTokens.first)
            #expect(stored.secrets.clientSecret?.text == harness.idp.clientSecret)
            #expect(stored.token?.idToken?.text == harness.idp.issuedIDTokens.first)

            _ = try await harness.broker.refreshNow(account: "work")
            let refresh = try #require(harness.idp.calls.last)
            #expect(refresh.grantType == "refresh_token")
            #expect(refresh.refreshToken == harness.idp.issuedRefreshTokens.first)
            #expect(harness.idp.rejectedReuse == 0)
            #expect(harness.idp.issuedRefreshTokens.count == 2)
            // Nothing secret reached the log.
            let secrets =
                [harness.idp.clientSecret] + harness.idp.issuedRefreshTokens + harness.idp.issuedAccessTokens
                + harness.idp.issuedIDTokens
            for line in harness.logs.all {
                #expect(!secrets.contains { line.contains($0) }, "\(line)")
            }
            #expect(harness.logs.all.contains { $0.contains("logged in") })
        }
    }

    @Test func slowDownAddsFiveSecondsToTheInterval() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.forceSlowDown()
            // A broker that ignored slow_down would hear it at every poll until the timeout.
            let (login, progress) = Self.startDeviceLogin(harness, timeout: 20)
            let offer = try await progress.first(.deviceCode)
            await Self.poll(harness)
            let slow = try await progress.first(.slowDown)
            #expect(slow.interval == 6)
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            #expect(try await login.value.state == "valid")
            let polls = harness.idp.devicePolls
            #expect(polls.count == 2)
            // The IdP answers slow_down to any poll sooner than the raised interval: none came.
            #expect(polls[1].timeIntervalSince(polls[0]) >= 6)
        }
    }

    @Test func aDenialEndsTheLoginWithNeedsLoginAndNoAccount() async throws {
        try await BrokerHarness.run { harness in
            let (login, progress) = Self.startDeviceLogin(harness)
            let offer = try await progress.first(.deviceCode)
            _ = try await harness.idp.decide(.deny, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            let error = try #require(await Self.failure(login))
            #expect(error.code == .needsLogin)
            #expect(error.message.contains("denied") && error.message.contains("access_denied"))
            #expect(error.message.contains("brokerctl login work"))
            #expect(!(await Self.accountExists(harness)))
        }
    }

    @Test func anExpiredDeviceCodeEndsTheLogin() async throws {
        try await BrokerHarness.run { harness in
            let (login, progress) = Self.startDeviceLogin(harness)
            _ = try await progress.first(.deviceCode)
            harness.idp.expireDeviceCodes()
            await Self.poll(harness)
            let error = try #require(await Self.failure(login))
            #expect(error.code == .needsLogin)
            #expect(error.message.contains("expired_token"))
            #expect(!(await Self.accountExists(harness)))
        }
    }

    @Test func theWaitEndsAtTheTimeout() async throws {
        try await BrokerHarness.run { harness in
            let started = harness.clock.now()
            let (login, progress) = Self.startDeviceLogin(harness, timeout: 2)
            _ = try await progress.first(.deviceCode)
            // One poll a second later, then the wait for the timeout, a second after that.
            await Self.poll(harness, times: 2)
            let error = try #require(await Self.failure(login))
            #expect(error.code == .needsLogin)
            #expect(error.message.contains("in time"))
            #expect(harness.idp.devicePolls.count == 1)
            #expect(harness.clock.now().timeIntervalSince(started) == 2)
            #expect(!(await Self.accountExists(harness)))
        }
    }

    @Test func anIdPWithoutADeviceEndpointIsRefusedForTheDeviceFlow() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setOffersDeviceEndpoint(false)
            let login = Self.start(
                harness, Self.request("device", provider: Self.provider(harness.idp)), progress: Progress())
            let error = try #require(await Self.failure(login))
            #expect(error.code == .badRequest)
            #expect(
                error.message
                    == "the IdP offers no device authorization endpoint (--flow device); sign in with brokerctl login "
                    + "work --flow browser")
            #expect(harness.idp.deviceAuthorizations == 0)
        }
    }

    @Test func aLoginReadsTheDiscoveryDocumentAfreshAndKeepsWhatItRead() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            // A first login reads the document, which offers a device endpoint, and keeps it.
            let progress = Progress()
            let first = Self.start(
                harness, Self.request("device", provider: Self.provider(harness.idp), account: "one"),
                progress: progress)
            let offer = try await progress.first(.deviceCode)
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            #expect(try await first.value.state == "valid")
            let read = harness.idp.discoveryCount

            // The IdP stops offering it: the next login reads the document again and says so.
            harness.idp.setOffersDeviceEndpoint(false)
            let second = Self.start(
                harness, Self.request("device", provider: Self.provider(harness.idp), account: "two"),
                progress: Progress())
            let error = try #require(await Self.failure(second))
            #expect(error.code == .badRequest)
            #expect(
                error.message
                    == "the IdP offers no device authorization endpoint (--flow device); sign in with brokerctl login "
                    + "two --flow browser")
            #expect(harness.idp.discoveryCount == read + 1)

            // It offers it again: the login after that sees it, though the kept copy did not.
            harness.idp.setOffersDeviceEndpoint(true)
            let again = Progress()
            let third = Self.start(
                harness, Self.request("device", provider: Self.provider(harness.idp), account: "three"), progress: again
            )
            _ = try await again.first(.deviceCode)
            third.cancel()
            _ = await Self.failure(third)
            // Refreshes use what the logins read, without reading it again.
            let reads = harness.idp.discoveryCount
            _ = try await harness.broker.refreshNow(account: "one")
            #expect(harness.idp.discoveryCount == reads)
        }
    }

    /// Hostile device authorization answers (RFC 8628 section 3.2): whatever the IdP says that
    /// would reach a terminal, a browser or a timer is refused unless it is bounded and plain.
    @Test(arguments: [
        #"{"device_code":"d","user_code":"U","verification_uri":"javascript:alert(1)","expires_in":600}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"file:///etc/passwd","expires_in":600}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"http://idp.example/device","expires_in":600}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"https://idp.example/\u001b[2J","expires_in":600}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"https://idp.example/\u202e","expires_in":600}"#,
        #"{"device_code":"d","user_code":"\u001b]0;x\u0007","verification_uri":"https://i.example/d","expires_in":600}"#,
        #"{"device_code":"d","user_code":"\#(String(repeating: "A", count: 65))","verification_uri":"https://i.example/d","expires_in":600}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"https://i.example/d","expires_in":1e308}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"https://i.example/d","expires_in":0}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"https://i.example/d","expires_in":600,"interval":1e9}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"https://i.example/d","expires_in":600,"interval":-5}"#,
        #"{"device_code":"d","user_code":"U","verification_uri":"https://i.example/d","expires_in":"soon"}"#,
        #"{"device_code":"","user_code":"U","verification_uri":"https://i.example/d","expires_in":600}"#,
        #"<html>Moved</html>"#, #"["device_code"]"#,
    ])
    func aHostileDeviceAnswerIsUnavailable(body: String) async throws {
        let http = IdPClient.inProcess(settings: BrokerSettings())
        let context = LoginContext(
            account: try AccountName("work"),
            settings: OAuth2Settings(
                tokenEndpoint: URL(string: "https://idp.example/token")!, clientID: "c", clientAuth: .none, scope: nil),
            clientSecret: nil, dpopKey: nil, http: http, clock: TestClock(), defaultLifetime: 600, progress: { _ in })
        for reply in [IdPReply(status: 200, body: Data(body.utf8)), IdPReply(status: 302, body: Data())] {
            // A redirect is not followed and not taken for an answer either.
            do {
                _ = try DeviceAuthorization.read(reply, context: context)
                Issue.record("taken: HTTP \(reply.status) \(body)")
            } catch {
                if case .loginUnavailable = error { continue }
                Issue.record("\(error)")
            }
        }
        // The same answer, plain, is taken.
        let plain = #"{"device_code":"d","user_code":"U","verification_uri":"https://i.example/d","expires_in":600}"#
        let offer = try? DeviceAuthorization.read(IdPReply(status: 200, body: Data(plain.utf8)), context: context)
        await http.shutdown()
        let taken = try #require(offer)
        #expect(taken.interval == DeviceAuthorization.defaultInterval && taken.expiresIn == 600)
    }

    /// The token endpoint's refusal of a grant quotes the IdP's error and description, cleaned
    /// and with the client secret redacted; a client error is told apart by its code; the IdP's
    /// own trouble (`server_error`) is `unavailable`, not a refusal.
    @Test func aTokenEndpointRefusalQuotesTheIdP() async throws {
        let secret = "cs-login-9d1e5a"
        let http = IdPClient.inProcess(settings: BrokerSettings())
        let context = LoginContext(
            account: try AccountName("work"),
            settings: OAuth2Settings(
                tokenEndpoint: URL(string: "https://idp.example/token")!, clientID: "c",
                clientAuth: .clientSecretPost, scope: nil),
            clientSecret: try SecretBytes(secret), dpopKey: nil, http: http, clock: TestClock(),
            defaultLifetime: 600, progress: { _ in })
        func outcome(_ status: Int, _ body: String) -> String {
            do {
                _ = try context.grant(
                    from: IdPReply(status: status, body: Data(body.utf8)), refusal: "the code exchange")
                return "taken"
            } catch {
                switch error {
                case .loginFailed(_, let reason): return "failed: \(reason)"
                case .clientRejected(_, let reason, _): return "client: \(reason)"
                case .loginUnavailable(let reason): return "unavailable: \(reason)"
                default: return "\(error)"
                }
            }
        }
        #expect(
            outcome(400, #"{"error":"invalid_grant","error_description":"code used\n\u0007\tby \#(secret)"}"#)
                == "failed: the IdP refused the code exchange: HTTP 400 (invalid_grant: code used by [redacted])")
        #expect(
            outcome(401, #"{"error":"invalid_client","error_description":"unknown client"}"#)
                == "client: the IdP refused the code exchange: HTTP 401 (invalid_client: unknown client)")
        #expect(
            outcome(400, #"{"error":"server_error","error_description":"try later"}"#)
                == "unavailable: the token endpoint answered HTTP 400 (server_error: try later)")
        await http.shutdown()
    }

    @Test func anUnreachableIdPIsUnavailable() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setBehavior(.status(503, retryAfter: nil))
            let provider = ProviderSpec(
                kind: "oauth2",
                [
                    "token_endpoint": .string(harness.idp.tokenEndpoint),
                    "device_authorization_endpoint": .string(harness.idp.deviceAuthorizationEndpoint),
                    "client_id": .string(harness.idp.clientID),
                ])
            let login = Self.start(harness, Self.request("device", provider: provider), progress: Progress())
            let error = try #require(await Self.failure(login))
            #expect(error.code == .unavailable)
            #expect(error.message.contains("503"))
        }
    }

    // MARK: Browser flow

    @Test func browserFlowExchangesTheCodeWithItsVerifierAndClosesTheListener() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            #expect(offer.expiresIn == 180)
            let port = try Self.port(of: offer.redirectURI)
            #expect(offer.redirectURI == "http://127.0.0.1:\(port)/callback")
            #expect(TestBrowser.isListening(port))

            let browser = TestBrowser()
            let url = try await browser.start(try #require(offer.url))
            #expect(url.hasPrefix(harness.idp.authorizationEndpoint + "?response_type=code&"))
            #expect(url.contains("code_challenge_method=S256") && url.contains("scope=openid%20offline_access"))
            let location = try await TestBrowser.authorize(url)
            #expect(location.hasPrefix(try #require(offer.redirectURI) + "?code="))
            let page = try await browser.visit(location)
            #expect(page.status == 200 && page.body.contains("Signed in. You may close this tab."))
            #expect(!page.body.contains(harness.idp.clientSecret))

            #expect(try await login.value == LoginResult(account: "work", state: "valid", idToken: true))
            #expect(harness.idp.rejectedCodeExchanges.isEmpty)
            #expect(!TestBrowser.isListening(port))
            let token = try await harness.broker.token(account: "work", minTTL: 60)
            #expect(harness.idp.issuedAccessTokens == [token.result.accessToken])
        }
    }

    /// The callback's page waits for the code exchange: refused (a wrong client secret, so the
    /// IdP answers `invalid_client`), it says why and what to check, never "signed in" nor the secret.
    @Test func aRefusedCodeExchangeShowsWhyOnTheCallbackPage() async throws {
        try await BrokerHarness.run { harness in
            let wrongSecret = "wrong-secret-7f3a"
            var provider = Self.provider(harness.idp)
            provider["client_secret"] = .string(wrongSecret)
            let progress = Progress()
            let login = Self.start(harness, Self.request("browser", provider: provider), progress: progress)
            let offer = try await progress.first(.authorizationURL)
            let page = try await TestBrowser().signIn(try #require(offer.url))
            #expect(!(200..<300).contains(page.status))
            let body = page.body.lowercased()
            #expect(!body.contains("signed in") && !body.contains("success"))
            #expect(body.contains("the sign-in failed") && body.contains("(invalid_client)"))
            #expect(body.contains("--client-id") && body.contains("--client-auth") && body.contains("client secret"))
            #expect(!page.body.contains(wrongSecret))
            let error = try #require(await Self.failure(login))
            #expect(error.code == .needsLogin)
            #expect(error.message.contains("--client-id") && !error.message.contains("run brokerctl login work again"))
            #expect(!TestBrowser.isListening(try Self.port(of: offer.redirectURI)))
            #expect(!(await Self.accountExists(harness)))
        }
    }

    /// The callback's page answers after the tokens are saved: when the vault cannot be written
    /// (a directory where its log goes), the page says the sign-in failed, not that it worked.
    @Test func aLoginWhoseTokensCannotBeSavedShowsAFailurePage() async throws {
        try await BrokerHarness.run { harness in
            _ = try await harness.broker.add(
                account: "other", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: "t", expiresIn: 3600))
            try FileManager.default.createDirectory(
                atPath: harness.vaultPath + ".log/in-the-way", withIntermediateDirectories: true)
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let page = try await TestBrowser().signIn(try #require(offer.url))
            #expect(!(200..<300).contains(page.status))
            let body = page.body.lowercased()
            #expect(!body.contains("signed in") && body.contains("the sign-in failed"), "\(page.body)")
            #expect(!page.body.contains(harness.idp.clientSecret))
            #expect(await Self.failure(login)?.code == .internal)
        }
    }

    /// The page's text is escaped: markup in the IdP's `error` shows as text.
    @Test func theCallbackPageEscapesWhatTheIdPSaid() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let browser = TestBrowser()
            let location = try await browser.authorize(try #require(offer.url))
            let state = try #require(URLComponents(string: location)?.queryItems?.first { $0.name == "state" }?.value)
            let redirect = try #require(offer.redirectURI)
            let page = try await browser.visit("\(redirect)?error=%3Cscript%3Ex%3C%2Fscript%3E%1B&state=\(state)")
            #expect(page.status == 403)
            #expect(page.body.contains("&lt;script&gt;x&lt;/script&gt;") && !page.body.contains("<script"))
            #expect(!page.body.contains("\u{1B}") && !page.body.lowercased().contains("signed in"))
            #expect(try #require(await Self.failure(login)).code == .needsLogin)
        }
    }

    @Test func aCallbackWithTheWrongStateGets400AndTheLoginKeepsWaiting() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let browser = TestBrowser()
            let location = try await browser.authorize(try #require(offer.url))
            let redirect = try #require(offer.redirectURI)
            for forged in [
                redirect + "?code=stolen&state=forged", redirect + "?code=stolen", redirect + "?error=access_denied",
            ] {
                let page = try await browser.visit(forged)
                #expect(page.status == 400)
            }
            #expect(try await browser.visit(redirect.replacing("/callback", with: "/other")).status == 404)
            #expect(try await browser.visit(location).status == 200)
            #expect(try await login.value.state == "valid")
            #expect(harness.idp.rejectedCodeExchanges.isEmpty)
        }
    }

    @Test func aDenialAtTheAuthorizationEndpointEndsTheLogin() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setAuthorizationDecision(.deny)
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let browser = TestBrowser()
            let location = try await browser.authorize(try #require(offer.url))
            #expect(location.contains("error=access_denied"))
            let page = try await browser.visit(location)
            #expect(page.status == 403 && page.body.contains("access_denied"))
            #expect(!page.body.lowercased().contains("signed in"))
            let error = try #require(await Self.failure(login))
            #expect(error.code == .needsLogin)
            #expect(error.message.contains("(access_denied)"))
            #expect(!TestBrowser.isListening(try Self.port(of: offer.redirectURI)))
            #expect(!(await Self.accountExists(harness)))
        }
    }

    @Test func theBrowserFlowTimesOutAndClosesTheListener() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness, timeout: 1)
            #expect(offer.expiresIn == 1)
            // The wait for the browser and the listener's own end.
            await harness.clock.sleepersReached(2)
            harness.clock.advance(by: 1)
            let error = try #require(await Self.failure(login))
            #expect(error.code == .needsLogin)
            #expect(!TestBrowser.isListening(try Self.port(of: offer.redirectURI)))
            #expect(!(await Self.accountExists(harness)))
        }
    }

    @Test func aRedirectPortInUseIsABadRequest() async throws {
        // Another server holds the port (the harness's IdP answers in process, on no port).
        let occupant = try await TestHTTPServer { _ in TestHTTPResponse(status: .ok, body: "") }
        try await BrokerHarness.run { harness in
            let taken = occupant.port
            let login = Self.start(
                harness, Self.request("browser", provider: Self.provider(harness.idp), redirectPort: taken),
                progress: Progress())
            let error = try #require(await Self.failure(login))
            #expect(error.code == .badRequest)
            #expect(
                error.message == "port \(taken) on 127.0.0.1 is in use; pick another --redirect-port or leave it out")
        }
        await occupant.shutdown()
    }

    @Test func aFixedRedirectPortIsUsed() async throws {
        try await BrokerHarness.run { harness in
            let port = try freePort()
            let progress = Progress()
            let login = Self.start(
                harness, Self.request("browser", provider: Self.provider(harness.idp), redirectPort: port),
                progress: progress)
            let offer = try await progress.first(.authorizationURL)
            #expect(offer.redirectURI == "http://127.0.0.1:\(port)/callback")
            #expect(offer.url?.hasPrefix("http://127.0.0.1:\(port)/start?k=") == true)
            _ = try await TestBrowser().signIn(try #require(offer.url))
            #expect(try await login.value.state == "valid")
        }
    }

    @Test func aCallbackRepeatingAParameterIsRefusedAndTheLoginKeepsWaiting() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let browser = TestBrowser()
            let location = try await browser.authorize(try #require(offer.url))
            let redirect = try #require(offer.redirectURI)
            let parts = try #require(URLComponents(string: location)?.queryItems)
            let code = try #require(parts.first { $0.name == "code" }?.value)
            let state = try #require(parts.first { $0.name == "state" }?.value)
            for forged in [
                "\(redirect)?code=stolen&state=forged&state=\(state)",
                "\(redirect)?state=\(state)&state=forged&code=stolen",
                "\(redirect)?code=stolen&code=\(code)&state=\(state)", "\(redirect)?error=x&error=y&state=\(state)",
            ] {
                #expect(try await browser.visit(forged).status == 400, "\(forged)")
            }
            // Only GET is a callback.
            #expect(try await TestBrowser.post(location, form: "").status == 404)
            #expect(try await browser.visit(location).status == 200)
            #expect(try await login.value.state == "valid")
            #expect(harness.idp.rejectedCodeExchanges.isEmpty)
        }
    }

    /// The client gets a one-time start link, not the authorization URL: the first browser to
    /// open it gets a cookie and the redirect to the IdP; another client is refused; the same
    /// browser may reload it.
    @Test func theStartLinkSendsOneBrowserToTheIdPWithACookie() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let start = try #require(offer.url)
            let port = try Self.port(of: offer.redirectURI)
            let key = try #require(URLComponents(string: start)?.queryItems?.first { $0.name == "k" }?.value)
            #expect(start == "http://127.0.0.1:\(port)/start?k=\(key)" && key.count == 43)
            // A wrong, missing or repeated key is not found, and leaves the link unused.
            for wrong in ["/start", "/start?k=", "/start?k=\(key)x", "/start?k=\(key)&k=\(key)", "/?k=\(key)"] {
                let page = try await TestBrowser.get("http://127.0.0.1:\(port)" + wrong)
                #expect(page.status == 404 && page.location == nil && page.setCookies.isEmpty, "\(wrong)")
            }

            let browser = TestBrowser()
            let first = try await browser.visit(start)
            #expect(first.status == 302)
            let url = try #require(first.location)
            #expect(url.hasPrefix(harness.idp.authorizationEndpoint + "?response_type=code&"))
            let query = try #require(URLComponents(string: url)?.queryItems)
            for name in ["state", "code_challenge"] {
                let value = try #require(query.first { $0.name == name }?.value)
                #expect(value.count == 43 && !start.contains(value), "\(name) is not in the start link")
            }
            #expect(first.setCookies.count == 1)
            let attributes = try #require(first.setCookies.first).split(separator: ";").map {
                $0.trimmingCharacters(in: .whitespaces)
            }
            let name = "tokenbroker_login_\(port)="
            #expect(attributes[0].hasPrefix(name) && attributes[0].count == name.count + 43)
            let maxAge = try #require(attributes.first { $0.hasPrefix("Max-Age=") }.flatMap { Int($0.dropFirst(8)) })
            #expect((1...180).contains(maxAge))
            #expect(Set(attributes.dropFirst()) == ["HttpOnly", "SameSite=Lax", "Path=/", "Max-Age=\(maxAge)"])

            // Spent: another client gets no redirect and no cookie; the same browser, reloading, goes on.
            let other = try await TestBrowser.get(start)
            #expect(other.status == 403 && other.location == nil && other.setCookies.isEmpty)
            let reload = try await browser.visit(start)
            #expect(reload.status == 302 && reload.location == url && reload.setCookies.isEmpty)
            #expect(try await browser.visit(try await TestBrowser.authorize(url)).status == 200)
            #expect(try await login.value.state == "valid")
        }
    }

    /// Another process that learned the authorization URL (its `state` and `code_challenge`)
    /// gets a code of its own at the IdP and brings it to the callback: without the cookie of the
    /// browser that opened the start link it completes nothing, the account keeps its tokens,
    /// and the user's browser still finishes the login.
    @Test func aCallbackWithTheRightStateFromAnotherClientCompletesNothing() async throws {
        try await BrokerHarness.run { harness in
            let (first, offer) = try await Self.startBrowserLogin(harness)
            _ = try await TestBrowser().signIn(try #require(offer.url))
            _ = try await first.value
            let stored = {
                try harness.vaultCopy()?.accounts.first { $0.name == "work" }?.secrets.refreshToken?.text
            }
            let before = try #require(try stored())
            let exchanges = { harness.idp.calls.filter { $0.grantType == "authorization_code" }.compactMap(\.code) }

            let progress = Progress()
            let login = Self.start(harness, Self.request("browser"), progress: progress)
            let again = try await progress.first(.authorizationURL)
            let port = try Self.port(of: again.redirectURI)
            let browser = TestBrowser()
            let url = try await browser.start(try #require(again.url))
            let forged = try await TestBrowser.authorize(url)
            let state = try #require(URLComponents(string: url)?.queryItems?.first { $0.name == "state" }?.value)
            #expect(forged.hasPrefix(try #require(again.redirectURI) + "?code=") && forged.hasSuffix("&state=\(state)"))
            for cookie in [nil, "tokenbroker_login_\(port)=forged", "tokenbroker_login_\(port + 1)=forged"] {
                let page = try await TestBrowser.get(forged, cookie: cookie)
                #expect(page.status == 403, "\(cookie ?? "no cookie")")
                #expect(page.body.contains("did not come from the browser that started the sign-in"))
            }
            #expect(exchanges().count == 1, "the forged code was not exchanged")
            #expect(try stored() == before, "the account keeps its tokens")

            let location = try await TestBrowser.authorize(url)
            #expect(try await browser.visit(location).status == 200)
            #expect(try await login.value.state == "valid")
            let code = try #require(URLComponents(string: location)?.queryItems?.first { $0.name == "code" }?.value)
            #expect(exchanges().count == 2 && exchanges().last == code, "the browser's code, not the forged one")
            #expect(try stored() != before)
        }
    }

    @Test func connectionsToTheRedirectPortAreBoundedAndAllCloseWithTheLogin() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let port = try Self.port(of: offer.redirectURI)
            // A local process opens 100 connections and sends nothing.
            let held = try (0..<100).map { _ in try HeldConnection(port: port) }
            defer { held.forEach { $0.close() } }
            // The broker keeps at most its bound open: it closed the others (the oldest first).
            let bound = LoopbackRedirect.maximumConnections
            #expect(await eventually { held.filter { $0.isClosedByPeer }.count >= held.count - bound })

            // A fresh callback still gets through.
            #expect(try await TestBrowser().signIn(try #require(offer.url)).status == 200)
            #expect(try await login.value.state == "valid")
            // Every connection ended with the login, well before its own lifetime.
            #expect(await eventually(timeout: 5) { held.allSatisfy { $0.isClosedByPeer } })
        }
    }

    @Test func aSilentConnectionIsClosedAfterItsLifetimeAndAnOversizedRequestAtOnce() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let port = try Self.port(of: offer.redirectURI)
            // Before the connections open, so their lifetimes end at least 5 s after it.
            let started = Date()
            let silent = try HeldConnection(port: port)
            defer { silent.close() }
            let trickling = try HeldConnection(port: port)
            defer { trickling.close() }
            trickling.send(Array("GET /callback?".utf8))
            let oversized = try HeldConnection(port: port)
            defer { oversized.close() }
            let head = "GET /callback HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
            oversized.send(Array((head + String(repeating: "a", count: LoopbackRedirect.maximumRequestBytes)).utf8))
            #expect(await eventually(timeout: 3) { oversized.isClosedByPeer })
            #expect(!silent.isClosedByPeer && !trickling.isClosedByPeer)

            // Still open while it sends a little now and then, but not past its lifetime.
            #expect(
                await eventually(timeout: 14) {
                    trickling.send(Array("a".utf8))
                    return trickling.isClosedByPeer
                })
            #expect(await eventually(timeout: 3) { silent.isClosedByPeer })
            #expect(Date().timeIntervalSince(started) >= 5)
            #expect(TestBrowser.isListening(port))
            #expect(try await TestBrowser().signIn(try #require(offer.url)).status == 200)
            #expect(try await login.value.state == "valid")
        }
    }

    @Test func aClientThatReadsNoProgressDoesNotKeepTheRedirectPortPastTheTimeout() async throws {
        try await BrokerHarness.run { harness in
            let port = try freePort()
            let request = Self.request("browser", provider: Self.provider(harness.idp), timeout: 10, redirectPort: port)
            // The progress line is never taken (as when the client does not read its socket): its
            // delivery ends only when the login is cancelled.
            let (untaken, keep) = AsyncStream.makeStream(of: Void.self)
            defer { keep.finish() }
            let login = Task {
                try await harness.broker.login(request, peerPID: getpid()) { _ in
                    for await _ in untaken {}
                }
            }
            // The listener's end is set before it reports its URL.
            await harness.clock.sleepersReached(1)
            #expect(TestBrowser.isListening(port))
            let held = try HeldConnection(port: port)
            defer { held.close() }
            harness.clock.advance(by: 10)
            #expect(await eventually(timeout: 30) { !TestBrowser.isListening(port) && held.isClosedByPeer })
            login.cancel()
            #expect(await Self.failure(login) != nil)
            #expect(!(await Self.accountExists(harness)))
        }
    }

    // MARK: Cancellation

    @Test func cancellingABrowserLoginClosesTheListenerAndCreatesNothing() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            let port = try Self.port(of: offer.redirectURI)
            #expect(TestBrowser.isListening(port))
            login.cancel()
            #expect(await Self.failure(login) != nil)
            #expect(!TestBrowser.isListening(port))
            #expect(!(await Self.accountExists(harness)))
        }
    }

    @Test func cancellingADeviceLoginStopsPollingAndCreatesNothing() async throws {
        try await BrokerHarness.run { harness in
            let (login, progress) = Self.startDeviceLogin(harness)
            let offer = try await progress.first(.deviceCode)
            await Self.poll(harness)
            await harness.clock.sleepersReached(1)
            login.cancel()
            // The cancelled login answers once its flow has stopped.
            #expect(await Self.failure(login) != nil)
            #expect(harness.idp.devicePolls.count == 1)
            // The user approves after all, and the interval passes many times: nobody asks any more.
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            harness.clock.advance(by: 60)
            #expect(harness.idp.devicePolls.count == 1)
            #expect(harness.idp.issuedRefreshTokens.isEmpty)
            #expect(!(await Self.accountExists(harness)))
        }
    }

    /// A login of an account whose login runs joins it, whatever flow it asks for: told so, it
    /// gets the running login's progress from the start and its outcome; the IdP sees one
    /// device authorization and one code exchange. One giving other settings is refused.
    @Test func aSecondLoginJoinsTheRunningOneAndGetsItsOutcome() async throws {
        try await BrokerHarness.run { harness in
            let (first, progress) = Self.startDeviceLogin(harness)
            let offer = try await progress.first(.deviceCode)
            let joined = Progress()
            let second = Self.start(
                harness, Self.request("browser", provider: Self.provider(harness.idp)), progress: joined)
            let replayed = try await joined.first(.deviceCode)
            #expect(joined.all.first == LoginProgress(event: .joined, flow: .device))
            #expect(replayed.userCode == offer.userCode && replayed.verificationURI == offer.verificationURI)
            #expect(!joined.all.contains { $0.event == .authorizationURL }, "no browser flow of its own")

            let other = Self.start(
                harness, Self.request("device", provider: Self.provider(harness.idp, scope: "openid email")),
                progress: Progress())
            #expect(await Self.failure(other)?.code == .badRequest)

            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            #expect(try await first.value == LoginResult(account: "work", state: "valid", idToken: true))
            #expect(try await second.value == LoginResult(account: "work", state: "valid", idToken: true))
            #expect(harness.idp.deviceAuthorizations == 1)
            #expect(harness.idp.authorizationRequests == 0)
            #expect(harness.idp.issuedRefreshTokens.count == 1, "one grant, stored once")
        }
    }

    /// The login that started the flow goes away: the flow goes on for the one that joined; once
    /// that one goes too, the flow stops.
    @Test func theFlowOutlivesItsStarterAndEndsWithItsLastParticipant() async throws {
        try await BrokerHarness.run { harness in
            let (first, progress) = Self.startDeviceLogin(harness)
            let offer = try await progress.first(.deviceCode)
            let joined = Progress()
            let second = Self.start(harness, Self.request("device"), progress: joined)
            _ = try await joined.first(.deviceCode)
            first.cancel()
            #expect(await Self.failure(first) != nil)
            await Self.poll(harness)
            await harness.clock.sleepersReached(1)
            #expect(harness.idp.devicePolls.count == 1, "still polling for the joiner")

            let third = Self.start(harness, Self.request("device"), progress: Progress())
            second.cancel()
            #expect(await Self.failure(second) != nil)
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            #expect(try await third.value.state == "valid", "the third kept the flow going")

            let last = Progress()
            let fourth = Self.start(harness, Self.request("device"), progress: last)
            let newOffer = try await last.first(.deviceCode)
            #expect(newOffer.userCode != offer.userCode, "a new flow once the last one ended")
            fourth.cancel()
            // The last participant answers once the flow has stopped.
            #expect(await Self.failure(fourth) != nil)
            let stopped = harness.idp.devicePolls.count
            harness.clock.advance(by: 60)
            #expect(harness.idp.devicePolls.count == stopped, "no participant left: polling stopped")
        }
    }

    // MARK: Existing accounts

    @Test func aDeniedAccountIsRestoredInPlaceWithItsSettings() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            let provider = Self.provider(harness.idp)
            _ = try await harness.broker.add(
                account: "work", provider: provider, tokens: TokenSet(refreshToken: "rt-dead"))
            // Generous: in a full parallel run the refresh can wait long for a cooperative thread.
            #expect(await eventually(timeout: 60) { (try? await harness.state("work").state) == "needs_login" })
            let before = try #require(try harness.vaultCopy()?.accounts.first { $0.name == "work" })
            #expect(before.needsLogin)

            let progress = Progress()
            let login = Self.start(harness, Self.request("device"), progress: progress)
            let offer = try await progress.first(.deviceCode)
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            #expect(try await login.value.state == "valid")

            let after = try #require(try harness.vaultCopy()?.accounts.first { $0.name == "work" })
            #expect(after.provider == before.provider)
            #expect(after.secrets.clientSecret == before.secrets.clientSecret)
            #expect(after.declared == before.declared)
            #expect(!after.needsLogin && after.lastError == nil)
            #expect(after.secrets.refreshToken?.text == harness.idp.issuedRefreshTokens.first)
            #expect(try await harness.state("work").state == "valid")
        }
    }

    @Test func anAccountRemovedWhileTheUserSignsInStaysRemoved() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            _ = try await harness.broker.add(account: "work", provider: Self.provider(harness.idp), tokens: nil)
            let progress = Progress()
            let login = Self.start(harness, Self.request("device"), progress: progress)
            let offer = try await progress.first(.deviceCode)
            _ = try await harness.broker.remove(account: "work")
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            let error = try #require(await Self.failure(login))
            #expect(error.code == .notFound)
            #expect(!(await Self.accountExists(harness)))
            #expect(try harness.vaultCopy()?.accounts.contains { $0.name == "work" } != true)
        }
    }

    @Test func loginsOfTwoAccountsRunAtOnce() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            let (one, two) = (Progress(), Progress())
            let first = Self.start(
                harness, Self.request("device", provider: Self.provider(harness.idp), account: "one"), progress: one)
            let second = Self.start(
                harness, Self.request("browser", provider: Self.provider(harness.idp), account: "two"), progress: two)
            let offer = try await one.first(.deviceCode)
            let url = try #require(try await two.first(.authorizationURL).url)
            _ = try await TestBrowser().signIn(url)
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            #expect(try await first.value.account == "one")
            #expect(try await second.value.account == "two")
            let stored = try #require(try harness.vaultCopy()?.accounts)
            let refreshTokens = Set(stored.compactMap(\.secrets.refreshToken?.text))
            #expect(refreshTokens.count == 2 && refreshTokens.isSubset(of: harness.idp.issuedRefreshTokens))
        }
    }

    @Test func aLoginGivingOtherSettingsForAnExistingAccountIsRefused() async throws {
        try await BrokerHarness.run { harness in
            _ = try await harness.broker.add(account: "work", provider: Self.provider(harness.idp), tokens: nil)
            let other = Self.provider(harness.idp, scope: "openid email")
            let login = Self.start(harness, Self.request("device", provider: other), progress: Progress())
            let error = try #require(await Self.failure(login))
            #expect(error.code == .badRequest)
            #expect(error.message.contains("work exists with other settings"))
            #expect(harness.idp.deviceAuthorizations == 0)
        }
    }

    @Test func aLoginOfAMissingAccountNeedsAProvider() async throws {
        try await BrokerHarness.run { harness in
            let login = Self.start(harness, Self.request("device"), progress: Progress())
            let error = try #require(await Self.failure(login))
            #expect(error.code == .notFound)
            #expect(error.message.contains("--issuer URL"))
        }
    }

    @Test func onlyOAuth2AccountsLogIn() async throws {
        try await BrokerHarness.run { harness in
            _ = try await harness.broker.add(
                account: "work", provider: ProviderSpec(kind: "static"), tokens: TokenSet(accessToken: "at"))
            let login = Self.start(harness, Self.request("device"), progress: Progress())
            #expect(await Self.failure(login)?.code == .badRequest)
        }
    }

    // MARK: Id tokens

    @Test func theIDTokenIsKeptAcrossARefreshWithoutOneAndReplacedByARotatedOne() async throws {
        try await BrokerHarness.run { harness in
            let (login, offer) = try await Self.startBrowserLogin(harness)
            _ = try await TestBrowser().signIn(try #require(offer.url))
            _ = try await login.value
            let first = try #require(harness.idp.issuedIDTokens.first)

            harness.idp.setIDTokensOnRefresh(false)
            _ = try await harness.broker.refreshNow(account: "work")
            #expect(harness.idp.issuedIDTokens.count == 1)
            #expect(try await harness.broker.idToken(account: "work", minTTL: 0).idToken == first)
            #expect(try await harness.broker.token(account: "work", minTTL: 0).result.idToken == first)

            harness.idp.setIDTokensOnRefresh(true)
            _ = try await harness.broker.refreshNow(account: "work")
            let rotated = try #require(harness.idp.issuedIDTokens.last)
            #expect(rotated != first)
            #expect(try await harness.broker.idToken(account: "work", minTTL: 0).idToken == rotated)
        }
    }

    @Test func theIDTokenAnswerCarriesItsExpiryAndAShortOneIsRefreshedOnce() async throws {
        try await BrokerHarness.run { harness in
            let now = harness.clock.now()
            harness.idp.setIDTokenExpiry(now.addingTimeInterval(30))
            let (login, offer) = try await Self.startBrowserLogin(harness)
            _ = try await TestBrowser().signIn(try #require(offer.url))
            _ = try await login.value

            let answer = try await harness.broker.idToken(account: "work", minTTL: 10)
            #expect(answer.idToken == harness.idp.issuedIDTokens.last)
            #expect(answer.expiresAt == Date(timeIntervalSince1970: (now.timeIntervalSince1970 + 30).rounded(.down)))
            #expect(answer.expiresIn == 30)
            #expect(harness.idp.calls.filter { $0.grantType == "refresh_token" }.isEmpty)

            // Too short for 60 s: one refresh, whose id token is as short: needs_login.
            await #expect(throws: BrokerError(.needsLogin, "")) {
                try await harness.broker.idToken(account: "work", minTTL: 60)
            }
            #expect(harness.idp.calls.filter { $0.grantType == "refresh_token" }.count == 1)

            // Within the minimum refresh interval of that refresh, no other: the id token held,
            // while it has not expired.
            harness.idp.setIDTokenExpiry(now.addingTimeInterval(3600))
            #expect(try await harness.broker.idToken(account: "work", minTTL: 60).expiresIn == 30)
            #expect(harness.idp.calls.filter { $0.grantType == "refresh_token" }.count == 1)

            // An IdP that renews it on refresh: the forced refresh, once the interval has passed,
            // serves a fresh one.
            harness.clock.advance(by: harness.settings.minimumRefreshInterval)
            let renewed = try await harness.broker.idToken(account: "work", minTTL: 60)
            #expect(renewed.expiresIn == 3600 - Int(harness.settings.minimumRefreshInterval))
            #expect(harness.idp.calls.filter { $0.grantType == "refresh_token" }.count == 2)
        }
    }

    @Test func anAccountWithoutAnIDTokenAnswersNotFound() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            let progress = Progress()
            let login = Self.start(
                harness, Self.request("device", provider: Self.provider(harness.idp, scope: "offline_access")),
                progress: progress)
            let offer = try await progress.first(.deviceCode)
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            #expect(try await login.value.idToken == false)
            await #expect(throws: BrokerError(.notFound, "")) {
                try await harness.broker.idToken(account: "work", minTTL: 0)
            }
            do {
                _ = try await harness.broker.idToken(account: "work", minTTL: 0)
            } catch let error as BrokerError {
                #expect(
                    error.message
                        == "work holds no id token: its IdP returned none (ask for the openid scope with --scope)")
            }
            await #expect(throws: BrokerError(.notFound, "")) {
                try await harness.broker.idToken(account: "nobody", minTTL: 0)
            }
        }
    }

    // MARK: Secrets files

    @Test func theBrokerReadsTheClientSecretFromAFileOfItsUser() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            let path = harness.directory.file("secrets.json")
            try Data(#"{"client_secret":"\#(harness.idp.clientSecret)"}"#.utf8).write(to: URL(fileURLWithPath: path))
            let progress = Progress()
            let login = Self.start(
                harness,
                Self.request("device", provider: Self.provider(harness.idp, secret: false), secretsFile: path),
                progress: progress)
            let offer = try await progress.first(.deviceCode)
            _ = try await harness.idp.decide(.approve, at: try #require(offer.verificationURIComplete))
            await Self.poll(harness)
            #expect(try await login.value.state == "valid")
            // client_secret_basic, with the secret from the file.
            #expect(harness.idp.calls.last?.clientSecret == harness.idp.clientSecret)
            let stored = try #require(try harness.vaultCopy()?.accounts.first { $0.name == "work" })
            #expect(stored.secrets.clientSecret?.text == harness.idp.clientSecret)
        }
    }

    @Test func theClientSecretCanComeFromADescriptorOfThePeer() async throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        defer { close(ends[0]) }
        let json = Array(#"{"client_secret":"from-the-pipe"}"#.utf8)
        #expect(write(ends[1], json, json.count) == json.count)
        close(ends[1])
        let secret = try await SecretsFile.clientSecret(at: "/proc/\(getpid())/fd/\(ends[0])", peerPID: getpid())
        #expect(secret == "from-the-pipe")
    }

    @Test(arguments: ["relative.json", "/proc/1/fd/0", "/proc/self/fd/0", "/proc/\(getpid())/environ"])
    func secretsFilesOutsideTheRulesAreRefused(path: String) async throws {
        await #expect(throws: BrokerFailure.self) {
            _ = try await SecretsFile.clientSecret(at: path, peerPID: getpid())
        }
    }

    @Test func aSymbolicLinkOrAnotherUsersFileIsRefusedWithoutItsContent() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let real = directory.file("real.json")
        try Data(#"{"client_secret":"do-not-echo"}"#.utf8).write(to: URL(fileURLWithPath: real))
        let link = directory.file("link.json")
        #expect(symlink(real, link) == 0)
        var refusals: [BrokerFailure] = []
        for path in [link] {
            do {
                _ = try await SecretsFile.clientSecret(at: path, peerPID: getpid())
            } catch {
                refusals.append(error)
            }
        }
        if getuid() == 0 {
            let foreign = directory.file("foreign.json")
            try Data(#"{"client_secret":"do-not-echo"}"#.utf8).write(to: URL(fileURLWithPath: foreign))
            #expect(chown(foreign, 65534, 65534) == 0)
            do {
                _ = try await SecretsFile.clientSecret(at: foreign, peerPID: getpid())
            } catch {
                refusals.append(error)
            }
        }
        #expect(refusals.count == (getuid() == 0 ? 2 : 1))
        for refusal in refusals {
            guard case .invalid(let reason) = refusal else {
                Issue.record("not a bad request: \(refusal)")
                continue
            }
            #expect(!reason.contains("do-not-echo"))
        }
        #expect("\(refusals)".contains("symbolic link"))
    }

    // MARK: The test IdP

    /// The test IdP refuses what real IdPs refuse, so the browser-flow tests mean something.
    @Test func theTestIdPRefusesAWrongVerifierAnotherRedirectAReusedCodeAndAnUnregisteredRedirect() async throws {
        let idp = try await OAuth2TestIdP(serving: .inProcess)
        let verifier = "a-verifier-of-forty-three-characters-0123456"
        let registered = "http://127.0.0.1:5555/callback"
        let escape = { (text: String) in text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "" }
        func authorize(_ redirect: String) async throws -> TestBrowser.Page {
            try await TestBrowser.get(
                idp.authorizationEndpoint + "?response_type=code&client_id=\(idp.clientID)&redirect_uri="
                    + escape(redirect) + "&state=s1&code_challenge=" + OAuth2TestIdP.challenge(for: verifier)
                    + "&code_challenge_method=S256&scope=openid")
        }
        func code() async throws -> String {
            let page = try await authorize(registered)
            #expect(page.status == 302)
            let items = URLComponents(string: try #require(page.location))?.queryItems ?? []
            #expect(items.first { $0.name == "state" }?.value == "s1")
            return try #require(items.first { $0.name == "code" }?.value)
        }
        for unregistered in [
            "http://evil.example/callback", "http://127.0.0.1/callback", "http://127.0.0.1:5555/other",
        ] {
            let page = try await authorize(unregistered)
            #expect(page.status == 400 && page.location == nil)
        }
        #expect(
            try await idp.exchange(code: try await code(), verifier: verifier + "x", redirectURI: registered) == 400)
        #expect(
            try await idp.exchange(
                code: try await code(), verifier: verifier, redirectURI: "http://127.0.0.1:6666/callback") == 400)
        let good = try await code()
        #expect(try await idp.exchange(code: good, verifier: verifier, redirectURI: registered) == 200)
        #expect(try await idp.exchange(code: good, verifier: verifier, redirectURI: registered) == 400)
        #expect(
            idp.rejectedCodeExchanges == ["code_verifier does not match", "redirect_uri differs", "code already used"])
        #expect(idp.issuedIDTokens.count == 1)
        await idp.shutdown()
    }

    // MARK: Units

    @Test func pkceChallengeIsRFC7636AppendixB() throws {
        let pkce = try PKCE(verifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk", state: "s")
        #expect(pkce.challenge == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
        let fresh = try PKCE()
        #expect(fresh.verifier.count == 43 && fresh.state.count == 43)
        #expect(try fresh.verifier != PKCE().verifier && fresh.state != fresh.verifier.text)
    }

    @Test func idTokenExpiryIsReadFromTheJWTPayloadOnly() {
        let payload = Base64URL.encode(Array(#"{"exp":1795426200,"sub":"x"}"#.utf8))
        #expect(IDToken.expiry(of: "e30.\(payload).sig") == Date(timeIntervalSince1970: 1_795_426_200))
        for token in [
            "opaque", "e30.\(payload)", "a.b.c.d.e", "e30.!!!.x",
            "e30.\(Base64URL.encode(Array(#"{"exp":"soon"}"#.utf8))).",
            "e30.\(Base64URL.encode(Array(#"{"exp":1e300}"#.utf8))).",
            "e30.\(Base64URL.encode(Array(#"{"exp":-5}"#.utf8))).",
            "e30.\(String(repeating: "A", count: 20_000)).",
        ] {
            #expect(IDToken.expiry(of: token) == nil, "\(token.prefix(40))")
        }
    }
}
