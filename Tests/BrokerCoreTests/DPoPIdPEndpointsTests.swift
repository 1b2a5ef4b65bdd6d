@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// No proof for the IdP's doors (docs/dpop.md): a program gets no DPoP proof for an endpoint of
/// the account's IdP, however it spells it, nor for any other URL on its origins unless
/// `dpop_allow` lists it, from the moment the account loads (a restart included); URLs elsewhere
/// get one, for their normal form.
@Suite struct DPoPIdPEndpointsTests {
    /// `api` at the test IdP, configured by its endpoints (token, revocation, device) or by its
    /// issuer, with `dpop` and `dpop_allow` listing the IdP's `/userinfo`; `add` refreshes it.
    static func addAccount(_ harness: BrokerHarness, byIssuer: Bool) async throws {
        let clock = harness.clock
        let idp = harness.idp
        idp.requireDPoP(nonce: false, clock: { clock.now() })
        var fields: [String: JSONValue] = [
            "client_id": .string(idp.clientID), "dpop": .string("ES256"),
            "dpop_allow": .array([.string(base(idp) + "/userinfo")]),
        ]
        if byIssuer {
            fields["issuer"] = .string(idp.issuer)
        } else {
            fields["token_endpoint"] = .string(idp.tokenEndpoint)
            fields["revocation_endpoint"] = .string(idp.revocationEndpoint)
            fields["device_authorization_endpoint"] = .string(idp.deviceAuthorizationEndpoint)
        }
        _ = try await harness.broker.add(
            account: "api", provider: ProviderSpec(kind: "oauth2", fields), tokens: TokenSet(refreshToken: "rt-0"))
        await harness.broker.drain()
    }

    /// `http://127.0.0.2:PORT`, the in-process IdP's origin.
    static func base(_ idp: OAuth2TestIdP) -> String { String(idp.tokenEndpoint.dropLast("/token".count)) }

    /// Spellings of the IdP's token endpoint, and its revocation and device endpoints.
    static func doors(_ idp: OAuth2TestIdP) -> [String] {
        let base = base(idp)
        let port = base.split(separator: ":").last ?? ""
        return [
            base + "/token", base + "/%74oken", base + "/./token", base + "/x/../token", base + "//token",
            base + "/token/", "http://localhost:\(port)/token", "HTTP://127.0.0.2:\(port)/token",
            "http://[::1]:\(port)/token?x=1", base + "/revoke", base + "/device/code",
        ]
    }

    static func target(_ url: String) throws -> DPoPTarget { try DPoPTarget(method: "POST", url: url, nonce: nil) }

    /// Expects `token`'s proofs refused at every door (as doors once they are known, else as
    /// URLs on the issuer's origin) and elsewhere on the IdP's origin but `/userinfo`, and given
    /// for another origin.
    static func expectRefusals(_ token: PreparedToken, idp: OAuth2TestIdP, doorsKnown: Bool) throws {
        for url in doors(idp) {
            let refusal = token.idpRefusal(try target(url))
            #expect(refusal?.contains(doorsKnown ? "an endpoint of the account's IdP" : "IdP") == true, "\(url)")
        }
        let base = base(idp)
        #expect(token.idpRefusal(try target(base + "/other"))?.contains("dpop_allow") == true)
        #expect(token.idpRefusal(try target(base + "/userinfo%2F..%2Ftoken"))?.contains("escaped") == true)
        #expect(token.idpRefusal(try target(base + "/userinfo")) == nil)
        #expect(token.idpRefusal(try target(base + "/./userinfo/")) == nil)
        #expect(token.idpRefusal(try target("https://api.example/token")) == nil)
    }

    @Test func anAccountConfiguredByItsEndpointsRefusesThemBeforeAndAfterARestart() async throws {
        try await BrokerHarness.run { harness in
            try await Self.addAccount(harness, byIssuer: false)
            let token = try await harness.broker.token(account: "api", minTTL: 0)
            try Self.expectRefusals(token, idp: harness.idp, doorsKnown: true)

            // A restarted broker on a new IdP client, which has called none of them yet.
            let http = IdPClient.inProcess(settings: harness.settings)
            let restarted = try harness.restart(http: http)
            let loaded = try await restarted.token(account: "api", minTTL: 0)
            try Self.expectRefusals(loaded, idp: harness.idp, doorsKnown: true)
            await restarted.drain()
            await http.shutdown()
        }
    }

    @Test func anAccountConfiguredByItsIssuerRefusesItsOriginUntilItsDocumentIsRead() async throws {
        try await BrokerHarness.run { harness in
            try await Self.addAccount(harness, byIssuer: true)
            let token = try await harness.broker.token(account: "api", minTTL: 0)
            try Self.expectRefusals(token, idp: harness.idp, doorsKnown: true)

            let http = IdPClient.inProcess(settings: harness.settings)
            let restarted = try harness.restart(http: http)
            let loaded = try await restarted.token(account: "api", minTTL: 0)
            // Whether or not the document has been read yet, the origin is refused.
            try Self.expectRefusals(loaded, idp: harness.idp, doorsKnown: false)
            let issuer = try #require(URL(string: harness.idp.issuer))
            _ = try await http.discovery.endpoints(issuer: issuer, http: http).get()
            try Self.expectRefusals(loaded, idp: harness.idp, doorsKnown: true)
            #expect(loaded.idpRefusal(try Self.target(harness.idp.issuer + "/")) != nil)
            await restarted.drain()
            await http.shutdown()
        }
    }

    /// The proof's `htu` is the URL's normal form, which the resource server checks.
    @Test func theProofCarriesTheNormalForm() async throws {
        try await BrokerHarness.run { harness in
            try await Self.addAccount(harness, byIssuer: false)
            let thumbprint = try #require(try await harness.state().dpop?.thumbprint)
            let token = try await harness.broker.token(account: "api", minTTL: 0)
            let target = try DPoPTarget(method: "GET", url: "HTTPS://API.example:443/v1/./x/../%69tems?p=2", nonce: nil)
            #expect(token.idpRefusal(target) == nil)
            let proof = try #require(token.proof(for: target, now: harness.clock.now()))
            let payload = try #require(proof.split(separator: ".").dropFirst().first)
            let json = try #require(Base64URL.decode(payload))
            let claims = try #require(JSONValue.object(decoding: json))
            #expect(claims["htu"]?.text == "https://api.example/v1/items")
            _ = try DPoPVerifier().verify(
                proof, method: "GET", url: "https://api.example/v1/items", now: harness.clock.now(),
                accessToken: token.result.accessToken, boundTo: thumbprint)
        }
    }

    /// Settings alone decide for an https IdP: the scheme's case and its default port are
    /// spellings of its endpoints too.
    @Test func anHTTPSIdPsEndpointsAreRefusedInEverySpelling() throws {
        var settings = OAuth2Settings(
            tokenEndpoint: URL(string: "https://idp.example/realms/a/token"), clientID: "cli", clientAuth: .none,
            scope: nil)
        settings.dpopAllow = ["https://idp.example/userinfo"]
        let endpoints = DPoPIdPEndpoints(settings: settings, discovery: DiscoveryCache())
        func refusal(_ url: String) throws -> String? { endpoints.refusal(for: try Self.target(url).normalized) }
        for url in [
            "HTTPS://IDP.EXAMPLE/realms/a/token", "https://idp.example:443/realms/a/token",
            "https://idp.example./realms/a//token/", "https://idp.example/realms/b/../a/%74oken",
        ] {
            #expect(try refusal(url)?.contains("an endpoint") == true, "\(url)")
        }
        #expect(try refusal("https://idp.example:443/userinfo") == nil)
        #expect(try refusal("https://idp.example/realms/a/token2")?.contains("dpop_allow") == true)
        #expect(try refusal("https://idp.example:8443/realms/a/token") == nil)
        #expect(try refusal("https://other.example/realms/a/token") == nil)
    }

    /// `dpop_allow` is kept in normal form and checked as a proof's `htu` is, bounded.
    @Test func dpopAllowIsKeptInNormalFormAndChecked() throws {
        var spec = ProviderSpec(
            kind: "oauth2",
            ["token_endpoint": "https://idp.example/token", "client_id": "c", "dpop": "ES256"])
        spec["dpop_allow"] = .array([.string("HTTPS://IDP.example:443/./user%69nfo")])
        let settings = try #require(try ProviderConfig.checking(spec).0.settings as? OAuth2Settings)
        #expect(settings.dpopAllow == ["https://idp.example/userinfo"])
        #expect(
            settings.fieldValues(changedBy: [:])?["dpop_allow"] == .array([.string("https://idp.example/userinfo")]))
        for bad: JSONValue in [
            "https://idp.example/userinfo", .array([.string("https://idp.example/userinfo?x")]),
            .array([.string("http://idp.example/userinfo")]), .array([.string("https://idp.example/%zz")]),
            .array(Array(repeating: .string("https://idp.example/u"), count: OAuth2Settings.dpopAllowLimit + 1)),
        ] {
            var refused = spec
            refused["dpop_allow"] = bad
            #expect(throws: BrokerFailure.self) { try ProviderConfig.checking(refused) }
        }
    }
}
