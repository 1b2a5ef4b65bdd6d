@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
import BrokerServer
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// A provider object of `kind`, with its fields set by `configure`.
private func spec(_ kind: String, _ configure: (inout ProviderSpec) -> Void = { _ in }) -> ProviderSpec {
    var spec = ProviderSpec(kind: kind)
    configure(&spec)
    return spec
}

/// `add`'s provider object: each kind's fields are checked, and a bad one is `bad_request`
/// with a message that says what is wrong.
@Suite struct ProviderSpecTests {
    @Test func refreshURLDefaultsToGETAndAcceptsPOST() throws {
        #expect(try WireTranslation.provider(spec("refresh_url")).0 == ProviderConfig(RefreshURLSettings(method: .get)))
        #expect(
            try WireTranslation.provider(spec("refresh_url") { $0["method"] = "POST" }).0
                == ProviderConfig(RefreshURLSettings(method: .post)))
        #expect(
            try WireTranslation.provider(spec("refresh_url") { $0["method"] = "get" }).0
                == ProviderConfig(RefreshURLSettings(method: .get)))
    }

    @Test func slidingTakesAnEndpointAndAZone() throws {
        let plain = try WireTranslation.provider(
            spec("sliding") { $0["endpoint"] = "https://idp.example/api/Auth/RefreshToken" })
        #expect(
            plain.0
                == ProviderConfig(
                    SlidingSettings(
                        endpoint: URL(string: "https://idp.example/api/Auth/RefreshToken")!, timeZone: "UTC"))
        )
        let zoned = try WireTranslation.provider(
            spec("sliding") {
                $0["endpoint"] = "http://127.0.0.1:8080/refresh"
                $0["timezone"] = "Asia/Tokyo"
            })
        #expect(
            zoned.0
                == ProviderConfig(
                    SlidingSettings(endpoint: URL(string: "http://127.0.0.1:8080/refresh")!, timeZone: "Asia/Tokyo")))
    }

    @Test func execTakesAnAbsoluteExecutable() throws {
        let (config, secret) = try WireTranslation.provider(
            spec("exec") { $0["command"] = ["/bin/echo", "a b", "$X"] })
        #expect(config == ProviderConfig(ExecSettings(command: ["/bin/echo", "a b", "$X"])))
        #expect(secret == nil)
    }

    @Test func oauth2TakesAnIssuerInsteadOfATokenEndpoint() throws {
        let (config, secret) = try WireTranslation.provider(
            ProviderSpec(
                kind: "oauth2", ["issuer": "https://login.example/realms/x", "client_id": "cli", "client_secret": "s"]))
        let settings = try #require(config.settings as? OAuth2Settings, "not oauth2: \(config.kind)")
        #expect(settings.tokenEndpoint == nil)
        #expect(settings.issuer == URL(string: "https://login.example/realms/x"))
        #expect(settings.clientAuth == .clientSecretBasic)
        #expect(secret == "s")
    }

    @Test(arguments: [
        (spec("refresh_url") { $0["method"] = "PUT" }, "method"),
        (spec("sliding"), "endpoint"),
        (spec("sliding") { $0["endpoint"] = "http://idp.example/refresh" }, "endpoint"),
        (spec("sliding") { $0["endpoint"] = "not a url" }, "endpoint"),
        (
            spec("sliding") {
                $0["endpoint"] = "https://idp.example/refresh"
                $0["timezone"] = "Mars/Olympus_Mons"
            }, "timezone"
        ),
        (
            spec("sliding") {
                $0["endpoint"] = "https://idp.example/refresh"
                $0["timezone"] = ""
            }, "timezone"
        ),
        (spec("exec"), "command"),
        (spec("exec") { $0["command"] = [] }, "command"),
        (spec("exec") { $0["command"] = ["echo", "hi"] }, "absolute"),
        (spec("exec") { $0["command"] = ["/nonexistent/get-token"] }, "executable"),
        (spec("exec") { $0["command"] = ["/etc/passwd"] }, "executable"),
        (spec("exec") { $0["command"] = ["/bin"] }, "executable"),
        (spec("exec") { $0["command"] = ["/bin/echo", "a\u{0}b"] }, "NUL"),
        (ProviderSpec(kind: "oauth2", ["client_id": "cli"]), "token_endpoint"),
        (ProviderSpec(kind: "oauth2", ["issuer": "http://login.example", "client_id": "cli"]), "issuer"),
        (ProviderSpec(kind: "oauth2", ["issuer": "https://login.example?x=1", "client_id": "cli"]), "issuer"),
        (
            ProviderSpec(
                kind: "oauth2",
                ["token_endpoint": "https://a.example/t", "issuer": "https://a.example", "client_id": "c"]),
            "not both"
        ),
        (ProviderSpec(kind: "oauth2", ["issuer": "https://login.example"]), "client_id"),
        (spec("kerberos"), "unknown provider kind"),
    ])
    func invalidProvidersAreBadRequests(spec: ProviderSpec, mentions: String) throws {
        do {
            _ = try WireTranslation.provider(spec)
            Issue.record("accepted \(spec)")
        } catch {
            #expect(error.code == .badRequest)
            #expect(error.message.contains(mentions), "\(error.message)")
        }
    }
}

/// The vault stores `ProviderConfig` in the shape of the enum's synthesized Codable: every kind
/// round-trips, and a record written before `issuer` existed still reads.
@Suite struct ProviderConfigCodingTests {
    @Test(arguments: [
        ProviderConfig(StaticSettings()),
        ProviderConfig(RefreshURLSettings(method: .post)),
        ProviderConfig(
            SlidingSettings(endpoint: URL(string: "https://idp.example/refresh")!, timeZone: "Europe/Berlin")),
        ProviderConfig(ExecSettings(command: ["/usr/bin/get-token", "--profile", "work"])),
        ProviderConfig(
            OAuth2Settings(
                tokenEndpoint: nil, clientID: "c", clientAuth: .none, scope: nil,
                issuer: URL(string: "https://i.example"))),
        ProviderConfig(
            OAuth2Settings(
                tokenEndpoint: URL(string: "https://idp.example/token"), clientID: "c", clientAuth: .none, scope: "s")
        ),
    ])
    func roundTrips(config: ProviderConfig) throws {
        let data = try JSONEncoder().encode(config)
        #expect(try JSONDecoder().decode(ProviderConfig.self, from: data) == config)
    }

    @Test func anOAuth2RecordWrittenBeforeIssuerExistedStillDecodes() throws {
        let old =
            #"{"oauth2":{"_0":{"tokenEndpoint":"https:\/\/idp.example\/token","clientID":"c","clientAuth":"none"}}}"#
        let config = try JSONDecoder().decode(ProviderConfig.self, from: Data(old.utf8))
        #expect(
            config
                == ProviderConfig(
                    OAuth2Settings(
                        tokenEndpoint: URL(string: "https://idp.example/token"), clientID: "c", clientAuth: .none,
                        scope: nil)))
    }
}

/// OIDC discovery: the issuer's token endpoint is read once and shared; failures are transient.
@Suite struct OIDCDiscoveryTests {
    private func reply(_ status: Int, _ body: String) -> IdPReply {
        IdPReply(status: status, body: Data(body.utf8), retryAfter: nil)
    }

    @Test(arguments: [
        ("https://login.example", "https://login.example/.well-known/openid-configuration"),
        ("https://login.example/", "https://login.example/.well-known/openid-configuration"),
        ("https://login.example/realms/x", "https://login.example/realms/x/.well-known/openid-configuration"),
    ])
    func theDocumentLivesUnderTheIssuer(issuer: String, document: String) {
        #expect(DiscoveryCache.documentURL(issuer: URL(string: issuer)!).absoluteString == document)
    }

    @Test func aGoodDocumentNamesTheTokenEndpoint() throws {
        let issuer = URL(string: "https://login.example/realms/x")!
        let body = #"{"issuer":"https://login.example/realms/x","token_endpoint":"https://login.example/t"}"#
        #expect(
            try DiscoveryCache.interpret(reply(200, body), issuer: issuer).get()
                == DiscoveredEndpoints(token: URL(string: "https://login.example/t")!, revocation: nil))
    }

    @Test func aDocumentMayNameARevocationEndpoint() throws {
        let issuer = URL(string: "https://login.example")!
        let body =
            #"{"issuer":"https://login.example","token_endpoint":"https://login.example/t","revocation_endpoint":"https://login.example/r"}"#
        #expect(
            try DiscoveryCache.interpret(reply(200, body), issuer: issuer).get().revocation
                == URL(string: "https://login.example/r"))
        // A plain-http revocation endpoint is ignored, not fatal: refreshes still work.
        let insecure =
            #"{"issuer":"https://login.example","token_endpoint":"https://login.example/t","revocation_endpoint":"http://login.example/r"}"#
        let endpoints = try DiscoveryCache.interpret(reply(200, insecure), issuer: issuer).get()
        #expect(endpoints.revocation == nil)
        #expect(endpoints.token == URL(string: "https://login.example/t"))
    }

    @Test func aDocumentMayNameTheLoginEndpointsAndUnusableOnesAreDropped() throws {
        let issuer = URL(string: "https://login.example")!
        let body = """
            {"issuer":"https://login.example","token_endpoint":"https://login.example/t",\
            "authorization_endpoint":"https://accounts.example/authorize",\
            "device_authorization_endpoint":"https://login.example/device/code"}
            """
        let endpoints = try DiscoveryCache.interpret(reply(200, body), issuer: issuer).get()
        #expect(endpoints.authorization == URL(string: "https://accounts.example/authorize"))
        #expect(endpoints.deviceAuthorization == URL(string: "https://login.example/device/code"))
        let insecure = """
            {"issuer":"https://login.example","token_endpoint":"https://login.example/t",\
            "authorization_endpoint":"http://login.example/authorize","device_authorization_endpoint":7}
            """
        let dropped = try DiscoveryCache.interpret(reply(200, insecure), issuer: issuer).get()
        #expect(dropped.authorization == nil && dropped.deviceAuthorization == nil)
        #expect(dropped.token == URL(string: "https://login.example/t"))
    }

    @Test func loginEndpointsAreCheckedLikeTheTokenEndpoint() throws {
        var spec = ProviderSpec(
            kind: "oauth2",
            [
                "token_endpoint": "https://idp.example/token", "client_id": "c",
                "authorization_endpoint": "https://idp.example/authorize",
                "device_authorization_endpoint": "https://idp.example/device",
            ])
        let settings = try #require(try ProviderConfig.checking(spec).0.settings as? OAuth2Settings)
        #expect(settings.authorizationEndpoint == URL(string: "https://idp.example/authorize"))
        #expect(settings.deviceAuthorizationEndpoint == URL(string: "https://idp.example/device"))
        for field in ["authorization_endpoint", "device_authorization_endpoint"] {
            var bad = spec
            bad[field] = "http://idp.example/x"
            #expect(throws: BrokerFailure.invalid("\"\(field)\" must be an https URL (http only for loopback)")) {
                try ProviderConfig.checking(bad)
            }
        }
        // The device endpoint is sent the client secret: a credential may not move to another origin there.
        let stored = try ProviderConfig.checking(spec).0
        spec["device_authorization_endpoint"] = "https://elsewhere.example/device"
        #expect(stored.credentialMove(to: try ProviderConfig.checking(spec).0) != nil)
    }

    @Test(arguments: [
        (200, #"{"issuer":"https://evil.example","token_endpoint":"https://evil.example/t"}"#),
        (200, #"{"issuer":"https://login.example"}"#),
        (200, #"{"issuer":"https://login.example","token_endpoint":"http://login.example/t"}"#),
        (200, #"{"issuer":"https://login.example","token_endpoint":42}"#),
        (200, "<html>"),
        (404, #"{"issuer":"https://login.example","token_endpoint":"https://login.example/t"}"#),
        (503, ""),
    ])
    func anythingElseIsTransient(status: Int, body: String) throws {
        let failure = try #require(
            DiscoveryCache.interpret(reply(status, body), issuer: URL(string: "https://login.example")!).failure)
        #expect(failure.kind == .transient)
    }

    /// Against a real IdP: one discovery, then the cached endpoint, for every account.
    @Test func theEndpointIsFetchedOnceAndShared() async throws {
        let idp = try await OAuth2TestIdP(serving: .inProcess)
        let http = IdPClient.inProcess(settings: BrokerSettings())
        let issuer = try #require(URL(string: idp.issuer))
        for _ in 0..<3 {
            let endpoint = try await http.discovery.tokenEndpoint(issuer: issuer, http: http).get()
            #expect(endpoint.absoluteString == idp.tokenEndpoint)
        }
        #expect(idp.discoveryCount == 1)
        await http.shutdown()
        await idp.shutdown()
    }

    /// A failed discovery is not cached: the next refresh asks again and can succeed.
    @Test func aFailedDiscoveryIsTransientAndRetried() async throws {
        let idp = try await OAuth2TestIdP(serving: .inProcess)
        let http = IdPClient.inProcess(settings: BrokerSettings())
        let issuer = try #require(URL(string: idp.issuer))
        idp.setDiscoveryBehavior(.status(503, retryAfter: 7))
        let failure = try #require(await http.discovery.tokenEndpoint(issuer: issuer, http: http).failure)
        #expect(failure.kind == .transient)
        #expect(failure.retryAfter == 7)
        idp.setDiscoveryBehavior(.garbage)
        #expect(try #require(await http.discovery.tokenEndpoint(issuer: issuer, http: http).failure).kind == .transient)
        idp.setDiscoveryBehavior(.normal)
        #expect(
            try await http.discovery.tokenEndpoint(issuer: issuer, http: http).get().absoluteString == idp.tokenEndpoint
        )
        #expect(idp.discoveryCount == 3)
        await http.shutdown()
        await idp.shutdown()
    }

    // MARK: the file kind

    @Test func aFileProviderTakesAnAbsolutePath() throws {
        let (config, secret) = try WireTranslation.provider(
            ProviderSpec(kind: "file", ["path": "/run/user/1000/tok.json"]))
        #expect(config == ProviderConfig(FileSettings(path: "/run/user/1000/tok.json")))
        #expect(config.kind == "file")
        #expect(secret == nil)
    }

    @Test(arguments: [
        (ProviderSpec(kind: "file"), "path"),
        (ProviderSpec(kind: "file", ["path": ""]), "path"),
        (ProviderSpec(kind: "file", ["path": "token.json"]), "absolute"),
        (ProviderSpec(kind: "file", ["path": "/var/tokens/"]), "absolute path of a file"),
        (ProviderSpec(kind: "file", ["path": "/tmp/a\u{0}b"]), "NUL"),
        (ProviderSpec(kind: "file", ["path": .string("/" + String(repeating: "a", count: 5000))]), "shorter"),
        (ProviderSpec(kind: "file", ["path": ["/tmp/a"]]), "must be a string"),
    ])
    func badPathsAreBadRequests(spec: ProviderSpec, mentions: String) {
        let error = #expect(throws: BrokerError.self) { try WireTranslation.provider(spec) }
        #expect(error?.code == .badRequest)
        #expect(error?.message.contains(mentions) == true, "\(error?.message ?? "")")
    }

    @Test func anAddWithAnOutOfRangePortIsRefused() {
        let spec = ProviderSpec(kind: "oauth2", ["token_endpoint": "https://idp.example:99999/t", "client_id": "c"])
        #expect(throws: BrokerError.self) { try WireTranslation.provider(spec) }
    }

    // MARK: every kind

    /// A field any kind knows is type-checked whatever the kind; one no kind knows is ignored,
    /// whatever it holds (forward compatibility).
    @Test func fieldsAreTypeCheckedForEveryKindAndUnknownOnesIgnored() throws {
        for (spec, field) in [
            (ProviderSpec(kind: "static", ["command": "/bin/true"]), "command"),
            (ProviderSpec(kind: "static", ["method": .number(5)]), "method"),
            (ProviderSpec(kind: "file", ["path": "/tmp/t.json", "client_id": .bool(true)]), "client_id"),
        ] {
            let error = #expect(throws: BrokerError.self) { try WireTranslation.provider(spec) }
            #expect(error?.code == .badRequest)
            #expect(error?.message.contains(field) == true, "\(error?.message ?? "")")
        }
        let future = ProviderSpec(
            kind: "static", ["x-future": .object(["a": [.number(1), .bool(true), .null]]), "scope": .null])
        #expect(try WireTranslation.provider(future).0 == ProviderConfig(StaticSettings()))
    }

    /// Only kinds that take a client secret keep one.
    @Test func aClientSecretIsKeptOnlyByKindsThatTakeOne() throws {
        let oauth2 = ProviderSpec(
            kind: "oauth2", ["token_endpoint": "https://idp.example/t", "client_id": "c", "client_secret": "s3"])
        #expect(try WireTranslation.provider(oauth2).clientSecret == "s3")
        let file = ProviderSpec(kind: "file", ["path": "/tmp/t.json", "client_secret": "s3"])
        #expect(try WireTranslation.provider(file).clientSecret == nil)
    }

    @Test func configTablesBecomeProviderObjectsWithTheKindsFields() throws {
        let text = """
            [accounts.cron]
            kind = "file"
            path = "/home/me/.cache/token.json"

            [accounts.helper]
            kind = "exec"
            command = ["/usr/bin/get-token", "--profile", "work"]
            """
        let accounts = try ConfigFile.parse(text, path: "/cfg/broker.toml").accounts
        #expect(accounts["cron"] == ProviderSpec(kind: "file", ["path": "/home/me/.cache/token.json"]))
        #expect(
            accounts["helper"] == ProviderSpec(kind: "exec", ["command": ["/usr/bin/get-token", "--profile", "work"]]))
        #expect(
            try WireTranslation.provider(accounts["cron"]).0
                == ProviderConfig(FileSettings(path: "/home/me/.cache/token.json")))
    }
}
