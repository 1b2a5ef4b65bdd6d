@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// How a refresh URL's answers are classified (seed 000, protocol/PROTOCOL.md section 11), and that the URL,
/// a secret, never shows up in a message.
@Suite struct RefreshURLProviderTests {
    static let now = Date(timeIntervalSince1970: 1_795_422_600)
    static let secretPath = "refresh/dom/mBCgGmDi6nLHGEUtsZzZhJXgbAxFyY4Zp9DCMqus"

    private func interpret(_ status: Int, _ body: String, retryAfter: TimeInterval? = nil) -> Result<
        Grant, RefreshFailure
    > {
        RefreshURLProvider.interpret(
            IdPReply(status: status, body: Data(body.utf8), retryAfter: retryAfter),
            from: URL(string: "https://idp.example/\(Self.secretPath)")!, now: Self.now, defaultLifetime: 600)
    }

    @Test func theSeedExampleYieldsTheTokenItsLifetimeAndTheNextURL() throws {
        let body = """
            {
              "access_token": "6FaIukmIEl4eaJ5UKXeWCLBB1Cui8O9lFmgtdPgrS0s",
              "refresh_url": "https://idp.example/refresh/dom/ehoviiRefX4bW7oO9i9vU30U1InbRCSMCzljz6bDdE4P",
              "expires_in": 28801
            }
            """
        let grant = try interpret(200, body).get()
        #expect(grant.token.value.text == "6FaIukmIEl4eaJ5UKXeWCLBB1Cui8O9lFmgtdPgrS0s")
        #expect(grant.token.type == "Bearer")
        #expect(grant.token.expiresAt == Self.now.addingTimeInterval(28_801))
        #expect(grant.refreshURL == "https://idp.example/refresh/dom/ehoviiRefX4bW7oO9i9vU30U1InbRCSMCzljz6bDdE4P")
        #expect(grant.refreshToken == nil)
    }

    @Test func anAnswerWithoutANewURLKeepsTheOldOneAndDefaultsTheLifetime() throws {
        let grant = try interpret(200, #"{"access_token":"at-1","refresh_url":null}"#).get()
        #expect(grant.refreshURL == nil)
        #expect(grant.token.expiresAt == Self.now.addingTimeInterval(600))
    }

    @Test(arguments: [
        "<html>this is not json", "", "[]", #"{"refresh_url":"https://idp.example/r/2"}"#, #"{"access_token":""}"#,
        #"{"access_token":"at-1","refresh_url":42}"#, #"{"access_token":"at-1","refresh_url":""}"#,
    ])
    func aSuccessStatusWithoutAUsableAnswerIsTransient(body: String) throws {
        let failure = try #require(interpret(200, body).failure)
        #expect(failure.kind == .transient)
    }

    @Test(arguments: [400, 401, 403, 404, 410])
    func aDeadURLIsADenial(status: Int) throws {
        let failure = try #require(interpret(status, #"{"error":"invalid"}"#).failure)
        #expect(failure.kind == .denial)
        #expect(failure.message.contains("\(status)"))
        #expect(failure.message.contains("the refresh URL"))
    }

    /// The IdP's error and description are quoted.
    @Test func aDeadURLsMessageQuotesTheIdP() throws {
        let failure = try #require(
            interpret(410, #"{"error":"invalid_grant","error_description":"used once already"}"#).failure)
        #expect(failure.message.contains("HTTP 410 (invalid_grant: used once already);"))
    }

    /// A dead-URL status whose body says the failure is the IdP's own keeps the URL.
    @Test(arguments: [400, 401, 403], ["server_error", "temporarily_unavailable"])
    func aServerErrorIsTransientWhateverTheStatus(status: Int, code: String) throws {
        let failure = try #require(
            interpret(status, #"{"error":"\#(code)","error_description":"busy"}"#, retryAfter: 3).failure)
        #expect(failure.kind == .transient)
        #expect(failure.retryAfter == 3)
        #expect(failure.message == "the refresh URL answered HTTP \(status) (\(code): busy)")
    }

    @Test(arguments: [
        (500, 30.0 as TimeInterval?), (502, nil), (503, 5), (429, 12), (408, nil), (302, nil),
    ])
    func serverTroubleIsTransientAndCarriesRetryAfter(status: Int, retryAfter: TimeInterval?) throws {
        let failure = try #require(interpret(status, "", retryAfter: retryAfter).failure)
        #expect(failure.kind == .transient)
        #expect(failure.retryAfter == retryAfter)
    }

    /// A stored URL the policy refuses is a denial (a person must push a new one), and the
    /// message does not repeat it.
    @Test(arguments: [
        "http://idp.example/\(secretPath)", "ftp://idp.example/\(secretPath)", "not a url \(secretPath)",
    ])
    func aRefusedStoredURLIsADenialThatDoesNotNameIt(url: String) async throws {
        let http = IdPClient.inProcess(settings: BrokerSettings())
        let provider = RefreshURLProvider(settings: .init(method: .get), http: http, defaultLifetime: 600)
        var record = AccountRecord.sample("url")
        record.provider = ProviderConfig(RefreshURLSettings(method: .get))
        record.secrets.refreshURL = try! SecretBytes(url)
        let failure = try #require(await provider.refresh(record, now: Self.now).failure)
        await http.shutdown()
        #expect(failure.kind == .denial)
        #expect(!failure.message.contains(Self.secretPath))
        #expect(!failure.message.contains("idp.example"))
    }

    /// An unreachable refresh URL is transient, and the message names neither host nor path.
    @Test func anUnreachableURLIsTransientAndTheMessageDoesNotNameIt() async throws {
        let http = IdPClient.inProcess(settings: BrokerSettings())
        let provider = RefreshURLProvider(settings: .init(method: .post), http: http, defaultLifetime: 600)
        var record = AccountRecord.sample("url")
        // Port 1 on loopback: connection refused at once.
        record.secrets.refreshURL = try! SecretBytes("http://127.0.0.1:1/\(Self.secretPath)")
        let failure = try #require(await provider.refresh(record, now: Self.now).failure)
        await http.shutdown()
        #expect(failure.kind == .transient)
        #expect(failure.message.contains("the refresh URL"))
        #expect(!failure.message.contains(Self.secretPath))
        #expect(!failure.message.contains("127.0.0.1"))
    }

    @Test func noStoredURLIsADenial() async throws {
        let http = IdPClient.inProcess(settings: BrokerSettings())
        let provider = RefreshURLProvider(settings: .init(method: .get), http: http, defaultLifetime: 600)
        var record = AccountRecord.sample("url")
        record.secrets.refreshURL = nil
        let failure = try #require(await provider.refresh(record, now: Self.now).failure)
        await http.shutdown()
        #expect(failure.kind == .denial)
    }
}
