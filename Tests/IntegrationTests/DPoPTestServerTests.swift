import Foundation
import TestSupport
import Testing

/// The DPoP test doubles (RFC 9449) refuse what a real server must: the tests of the broker's
/// proofs prove something only if a bad proof fails here. The verifier alone, then the test IdP
/// and the resource server over real HTTP.
@Suite struct DPoPTestServerTests {
    static let url = "http://127.0.0.1:8080/items"
    static let token = "at-1-example"

    // MARK: The verifier

    @Test func aGoodProofPassesOnceAndNamesItsKey() throws {
        let verifier = DPoPVerifier()
        let signer = DPoPTestSigner()
        let proof = signer.proof(method: "GET", url: Self.url, accessToken: Self.token)
        let thumbprint = try verifier.verify(
            proof, method: "GET", url: Self.url, now: Date(), accessToken: Self.token, boundTo: signer.thumbprint)
        #expect(thumbprint == signer.thumbprint)
        #expect(thumbprint == DPoPVerifier.thumbprint(x: signer.x, y: signer.y))
        #expect(throws: DPoPRefusal.replayed) {
            try verifier.verify(proof, method: "GET", url: Self.url, now: Date(), accessToken: Self.token)
        }
    }

    /// RFC 9449's own examples: the proof of its figure 2 (whose `jwk` lists its members out of
    /// RFC 7638's order), that key's thumbprint from figure 9, and the `ath` of section 7's token.
    @Test func theRFCsExamplesCheckOut() throws {
        let proof =
            "eyJ0eXAiOiJkcG9wK2p3dCIsImFsZyI6IkVTMjU2IiwiandrIjp7Imt0eSI6IkVDIiwieCI6Imw4dEZyaHgtMzR0VjNoUklDUkRZOXpDa0Rs"
            + "cEJoRjQyVVFVZldWQVdCRnMiLCJ5IjoiOVZFNGpmX09rX282NHpiVFRsY3VOSmFqSG10NnY5VERWclUwQ2R2R1JEQSIsImNydiI6IlAtMjU2"
            + "In19.eyJqdGkiOiItQndDM0VTYzZhY2MybFRjIiwiaHRtIjoiUE9TVCIsImh0dSI6Imh0dHBzOi8vc2VydmVyLmV4YW1wbGUuY29tL3Rva2Vu"
            + "IiwiaWF0IjoxNTYyMjYyNjE2fQ.2-GxA6T8lP4vfrg8v-FdWP0A0zdrj8igiMLvqRMUvwnQg4PtFLbdLXiOSsX0x7NVY-FNyJK70nfbV37xRZT3Lg"
        let then = Date(timeIntervalSince1970: 1_562_262_616)
        let url = "https://server.example.com/token"
        let thumbprint = try DPoPVerifier().verify(proof, method: "POST", url: url, now: then)
        #expect(thumbprint == "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I")
        #expect(
            DPoPVerifier.hash("Kz~8mXK1EalYznwH-LC-1fBAo.4Ljp~zsPE_NeO.gxU")
                == "fUHyO2r2Z3DZ53EsNrWBb0xWXoaNy59IiKCAqksmQEo")
        #expect(throws: DPoPRefusal.iat) { try DPoPVerifier().verify(proof, method: "POST", url: url, now: Date()) }
    }

    @Test func htuIsComparedAfterNormalisationAndWithoutTheRequestsQuery() throws {
        let verifier = DPoPVerifier()
        let signer = DPoPTestSigner()
        for htu in ["HTTP://127.0.0.1:80/a/./b/../../items", "http://127.0.0.1/%69tems", "http://127.0.0.1"] {
            let path = htu.hasSuffix("127.0.0.1") ? "" : "/items"
            let proof = signer.proof(method: "GET", url: htu)
            _ = try verifier.verify(proof, method: "GET", url: "http://127.0.0.1\(path)?page=2#top", now: Date())
        }
        for htu in ["http://127.0.0.1/items?page=2", "http://127.0.0.1/items#top", "https://127.0.0.1/items"] {
            #expect(throws: DPoPRefusal.htu, "\(htu)") {
                try verifier.verify(
                    signer.proof(method: "GET", url: htu), method: "GET", url: "http://127.0.0.1/items", now: Date())
            }
        }
    }

    /// Every check of RFC 9449 section 4.3 refuses, each with its own reason.
    @Test func eachFlawIsRefusedWithItsOwnReason() throws {
        let verifier = DPoPVerifier()
        let signer = DPoPTestSigner()
        let now = Date()
        func refusal(
            _ proof: String, method: String = "GET", accessToken: String? = Self.token, nonce: String? = nil,
            jkt: String? = nil
        ) -> DPoPRefusal? {
            do throws(DPoPRefusal) {
                _ = try verifier.verify(
                    proof, method: method, url: Self.url, now: now, accessToken: accessToken, nonce: nonce, boundTo: jkt
                )
                return nil
            } catch {
                return error
            }
        }
        func proof(
            method: String = "GET", url: String = Self.url, at date: Date = now, accessToken: String? = Self.token,
            nonce: String? = nil, jti: String? = nil, _ flaw: (inout DPoPTestSigner.Flaws) -> Void = { _ in }
        ) -> String {
            var flaws = DPoPTestSigner.Flaws()
            flaw(&flaws)
            return signer.proof(
                method: method, url: url, at: date, accessToken: accessToken, nonce: nonce, jti: jti, flaws: flaws)
        }
        let good = proof()
        let parts = good.split(separator: ".")
        let otherPayload = proof(method: "POST").split(separator: ".")[1]

        #expect(refusal(proof(url: "http://127.0.0.1:8080/other")) == .htu)
        #expect(refusal(proof(url: "http://127.0.0.1:8081/items")) == .htu)
        #expect(refusal(proof(method: "POST")) == .htm)
        #expect(refusal(proof(accessToken: "at-2-other")) == .ath)
        #expect(refusal(proof(accessToken: nil)) == .ath)
        #expect(refusal(proof(), jkt: DPoPTestSigner().thumbprint) == .jkt)
        #expect(refusal(proof { $0.alg = "none" }) == .alg)
        #expect(refusal(proof { $0.alg = "HS256" }) == .alg)
        #expect(refusal(proof { $0.typ = "JWT" }) == .typ)
        #expect(refusal(proof { $0.typ = nil }) == .typ)
        #expect(refusal(proof { $0.privateKeyInJWK = true }) == .jwkPrivate)
        #expect(refusal(proof { $0.curve = "P-384" }) == .jwk)
        #expect(refusal(proof { $0.foreignSignature = true }) == .signature)
        #expect(refusal("\(parts[0]).\(otherPayload).\(parts[2])") == .signature)
        #expect(refusal(proof(at: now.addingTimeInterval(-61))) == .iat)
        #expect(refusal(proof(at: now.addingTimeInterval(61))) == .iat)
        #expect(refusal(proof { $0.iat = "\(Int(now.timeIntervalSince1970)).5" }) == .iat)
        #expect(refusal(proof { $0.iat = #""\#(Int(now.timeIntervalSince1970))""# }) == .iat)
        #expect(refusal(proof { $0.iat = "1e400" }) == .malformed)
        #expect(refusal(proof(), nonce: "n-1") == .nonce)
        #expect(refusal(proof(nonce: "n-0"), nonce: "n-1") == .nonce)
        #expect(refusal(proof(jti: "short")) == .jti)
        #expect(refusal("") == .missing)
        #expect(refusal(good + "," + proof()) == .multiple)
        #expect(refusal(String(repeating: "a", count: 8193)) == .tooLarge)
        #expect(refusal("\(parts[0]).\(parts[1])") == .malformed)
        #expect(refusal("\(parts[0])=.\(parts[1]).\(parts[2])") == .malformed)
        #expect(throws: DPoPRefusal.missing) {
            try verifier.verify(proofs: [], method: "GET", url: Self.url, now: now)
        }
        #expect(throws: DPoPRefusal.multiple) {
            try verifier.verify(proofs: [proof(), proof()], method: "GET", url: Self.url, now: now)
        }

        // None of the refusals spent the good proof's jti; its first use passes, its second not.
        #expect(refusal(good, method: "POST") == .htm)
        #expect(refusal(good) == nil)
        #expect(refusal(good) == .replayed)
        #expect(refusal(proof(nonce: "n-1"), nonce: "n-1") == nil)
    }

    @Test func aGivenKeySignsAsItsOwner() throws {
        let raw = Data((1...32).map { UInt8($0) })
        let signer = try DPoPTestSigner(rawPrivateKey: raw)
        let again = try DPoPTestSigner(rawPrivateKey: raw)
        #expect(signer.thumbprint == again.thumbprint)
        let proof = again.proof(url: Self.url)
        #expect(try DPoPVerifier().verify(proof, method: "POST", url: Self.url, now: Date()) == signer.thumbprint)
    }

    // MARK: The IdP and the resource server

    /// Runs `body` with a test IdP (in DPoP mode unless `dpop` is false) and a resource server
    /// for its tokens, both on 127.0.0.1 unless served in process; both are stopped on every way out.
    static func withServers(
        serving: TestIdPServing = .http, dpop: Bool = true, nonce: Bool = false,
        _ body: (OAuth2TestIdP, DPoPResourceServer) async throws -> Void
    ) async throws {
        let idp = try await OAuth2TestIdP(serving: serving)
        if dpop { idp.requireDPoP(nonce: nonce) }
        let server = try await DPoPResourceServer(idp: idp, serving: serving)
        do {
            try await body(idp, server)
        } catch {
            await server.shutdown()
            await idp.shutdown()
            throw error
        }
        await server.shutdown()
        await idp.shutdown()
    }

    /// A DPoP-bound access token for `signer`'s key, from a refresh of the IdP's first refresh token.
    static func boundToken(_ idp: OAuth2TestIdP, for signer: DPoPTestSigner) async throws -> String {
        let reply = try await idp.refresh("rt-0", proof: signer.proof(url: idp.tokenEndpoint))
        #expect(reply.status == 200 && reply.field("token_type") == "DPoP")
        return try #require(reply.field("access_token"))
    }

    @Test(arguments: [TestIdPServing.http, .inProcess])
    func theResourceServerTakesOnlyAProofOfTheTokensKeyForThisRequest(serving: TestIdPServing) async throws {
        try await Self.withServers(serving: serving) { idp, server in
            let broker = DPoPTestSigner()
            let attacker = DPoPTestSigner()
            let token = try await Self.boundToken(idp, for: broker)
            #expect(idp.boundThumbprint(ofAccessToken: token) == broker.thumbprint)

            let good = broker.proof(method: "GET", url: server.url, accessToken: token)
            let answer = try await server.request(token: token, proofs: [good])
            #expect(answer.status == 200 && answer.body == #"{"ok":true}"#)
            let withQuery = try await server.request(
                url: server.url + "?page=2", token: token,
                proofs: [broker.proof(method: "GET", url: server.url, accessToken: token)])
            #expect(withQuery.status == 200)

            /// A proof for a GET of the resource unless told otherwise.
            func proof(
                by signer: DPoPTestSigner? = nil, method: String = "GET", url: String? = nil, at date: Date? = nil,
                for other: String? = nil, _ flaw: (inout DPoPTestSigner.Flaws) -> Void = { _ in }
            ) -> [String] {
                var flaws = DPoPTestSigner.Flaws()
                flaw(&flaws)
                return [
                    (signer ?? broker).proof(
                        method: method, url: url ?? server.url, at: date ?? Date(), accessToken: other ?? token,
                        flaws: flaws)
                ]
            }
            let refused: [(proofs: [String], scheme: String, token: String, reason: String)] = [
                ([good], "DPoP", token, "replayed"),
                (proof(url: server.url + "/other"), "DPoP", token, "htu"),
                (proof(method: "POST"), "DPoP", token, "htm"),
                (proof(for: "at-9-other"), "DPoP", token, "ath"),
                (proof(by: attacker), "DPoP", token, "jkt"),
                ([], "DPoP", token, "missing"),
                (proof(), "Bearer", token, "bearer"),
                ([], "Bearer", token, "bearer"),
                (proof { $0.alg = "none" }, "DPoP", token, "alg"),
                (proof { $0.privateKeyInJWK = true }, "DPoP", token, "jwk_private"),
                (proof(at: Date().addingTimeInterval(-600)), "DPoP", token, "iat"),
                (proof(for: "at-9-9"), "DPoP", "at-9-9", "token"),
            ]
            for (proofs, scheme, token, reason) in refused {
                let answer = try await server.request(token: token, scheme: scheme, proofs: proofs)
                #expect(answer.status == 401, "\(reason)")
                let error = ["bearer", "token"].contains(reason) ? "invalid_token" : "invalid_dpop_proof"
                #expect(answer.header("WWW-Authenticate") == #"DPoP error="\#(error)", algs="ES256""#, "\(reason)")
            }
            #expect(server.refusals == refused.map { $0.reason })

            let anonymous = try await server.request(token: nil)
            #expect(anonymous.status == 401 && anonymous.header("WWW-Authenticate") == #"DPoP algs="ES256""#)
            #expect(server.successes == 2)
        }
    }

    @Test func theResourceServersNonceIsDemandedThenTaken() async throws {
        try await Self.withServers { idp, server in
            let signer = DPoPTestSigner()
            let token = try await Self.boundToken(idp, for: signer)
            server.requireNonce()
            let first = try await server.request(
                token: token, proofs: [signer.proof(method: "GET", url: server.url, accessToken: token)])
            #expect(first.status == 401)
            #expect(first.header("WWW-Authenticate")?.hasPrefix(#"DPoP error="use_dpop_nonce""#) == true)
            let nonce = try #require(first.header("DPoP-Nonce"))
            let retry = try await server.request(
                token: token, proofs: [signer.proof(method: "GET", url: server.url, accessToken: token, nonce: nonce)])
            #expect(retry.status == 200 && retry.header("DPoP-Nonce") == nonce)
            #expect(server.refusals == ["nonce"] && server.successes == 1)
        }
    }

    @Test func theIdPDemandsAValidProofAndBindsTheTokensToItsKey() async throws {
        try await Self.withServers { idp, server in
            let signer = DPoPTestSigner()
            let none = try await idp.refresh("rt-0", proof: nil)
            #expect(none.status == 400 && none.field("error") == "invalid_dpop_proof")
            let elsewhere = try await idp.refresh("rt-0", proof: signer.proof(url: server.url))
            #expect(elsewhere.status == 400 && elsewhere.field("error") == "invalid_dpop_proof")
            let asGet = try await idp.refresh("rt-0", proof: signer.proof(method: "GET", url: idp.tokenEndpoint))
            #expect(asGet.status == 400 && asGet.field("error") == "invalid_dpop_proof")
            #expect(idp.dpopRefusals == ["missing", "htu", "htm"])
            #expect(idp.issuedAccessTokens.isEmpty)

            let token = try await Self.boundToken(idp, for: signer)
            #expect(idp.boundThumbprint(ofAccessToken: token) == signer.thumbprint)
            #expect(idp.dpopProofsSeen == 3)
            let discovery = try await TestHTTPClient.send("GET", idp.issuer + "/.well-known/openid-configuration")
            #expect(discovery.body.contains(#""dpop_signing_alg_values_supported":["ES256"]"#))
        }
    }

    @Test(arguments: [TestIdPServing.http, .inProcess])
    func theIdPsNonceDance(serving: TestIdPServing) async throws {
        try await Self.withServers(serving: serving, nonce: true) { idp, _ in
            let signer = DPoPTestSigner()
            let first = try await idp.refresh("rt-0", proof: signer.proof(url: idp.tokenEndpoint))
            #expect(first.status == 400 && first.field("error") == "use_dpop_nonce")
            let nonce = try #require(first.header("DPoP-Nonce"))
            #expect(nonce == idp.dpopNonce)
            let retry = try await idp.refresh("rt-0", proof: signer.proof(url: idp.tokenEndpoint, nonce: nonce))
            #expect(retry.status == 200 && retry.field("token_type") == "DPoP")
            #expect(retry.header("DPoP-Nonce") == nonce)

            idp.rotateDPoPNonce()
            let refreshToken = try #require(retry.field("refresh_token"))
            let old = try await idp.refresh(refreshToken, proof: signer.proof(url: idp.tokenEndpoint, nonce: nonce))
            #expect(old.status == 400 && old.field("error") == "use_dpop_nonce")
            let rotated = try #require(old.header("DPoP-Nonce"))
            #expect(rotated != nonce)
            let again = try await idp.refresh(
                refreshToken, proof: signer.proof(url: idp.tokenEndpoint, nonce: rotated))
            #expect(again.status == 200)
            #expect(idp.dpopRefusals == ["nonce", "nonce"])
        }
    }

    @Test func aPublicClientsRefreshTokenServesOnlyItsKey() async throws {
        try await Self.withServers { idp, _ in
            let broker = DPoPTestSigner()
            let attacker = DPoPTestSigner()
            let first = try await idp.refresh(
                "rt-0", proof: broker.proof(url: idp.tokenEndpoint), confidential: false)
            #expect(first.status == 200)
            let refreshToken = try #require(first.field("refresh_token"))
            #expect(idp.boundThumbprint(ofRefreshToken: refreshToken) == broker.thumbprint)

            let stolen = try await idp.refresh(
                refreshToken, proof: attacker.proof(url: idp.tokenEndpoint), confidential: false)
            #expect(stolen.status == 400 && stolen.field("error") == "invalid_grant")
            #expect(idp.dpopRefusals == ["jkt"])
            let owner = try await idp.refresh(
                refreshToken, proof: broker.proof(url: idp.tokenEndpoint), confidential: false)
            #expect(owner.status == 200)
        }
    }

    @Test func aConfidentialClientsRefreshTokenIsNotBoundToAKey() async throws {
        try await Self.withServers { idp, _ in
            let first = try await idp.refresh("rt-0", proof: DPoPTestSigner().proof(url: idp.tokenEndpoint))
            let refreshToken = try #require(first.field("refresh_token"))
            #expect(idp.boundThumbprint(ofRefreshToken: refreshToken) == nil)
            let newKey = DPoPTestSigner()
            let second = try await idp.refresh(refreshToken, proof: newKey.proof(url: idp.tokenEndpoint))
            #expect(second.status == 200)
            let token = try #require(second.field("access_token"))
            #expect(idp.boundThumbprint(ofAccessToken: token) == newKey.thumbprint)
        }
    }

    @Test func aCodeExchangeNeedsTheKeyOfItsDPoPJKT() async throws {
        try await Self.withServers { idp, _ in
            let broker = DPoPTestSigner()
            let attacker = DPoPTestSigner()
            let verifier = "verifier-\(String(repeating: "v", count: 43))"
            let redirect = "http://127.0.0.1:4999/callback"
            func code() async throws -> String {
                let query = [
                    ("response_type", "code"), ("client_id", idp.clientID), ("redirect_uri", redirect),
                    ("code_challenge", OAuth2TestIdP.challenge(for: verifier)), ("code_challenge_method", "S256"),
                    ("state", "s-1"), ("dpop_jkt", broker.thumbprint),
                ]
                var components = try #require(URLComponents(string: idp.authorizationEndpoint))
                components.queryItems = query.map { URLQueryItem(name: $0.0, value: $0.1) }
                let location = try await TestBrowser.authorize(try #require(components.string))
                let back = try #require(URLComponents(string: location))
                return try #require(back.queryItems?.first { $0.name == "code" }?.value)
            }
            func exchange(_ code: String, _ signer: DPoPTestSigner) async throws -> TestHTTPClient.Reply {
                try await idp.tokenRequest(
                    [
                        ("grant_type", "authorization_code"), ("code", code), ("code_verifier", verifier),
                        ("redirect_uri", redirect), ("client_id", idp.clientID), ("client_secret", idp.clientSecret),
                    ], proofs: [signer.proof(url: idp.tokenEndpoint)])
            }
            let stolen = try await exchange(try await code(), attacker)
            #expect(idp.authorizationDPoPJKT == broker.thumbprint)
            #expect(stolen.status == 400 && stolen.field("error") == "invalid_grant")
            #expect(idp.rejectedCodeExchanges == ["DPoP key is not dpop_jkt"])
            let owned = try await exchange(try await code(), broker)
            #expect(owned.status == 200 && owned.field("token_type") == "DPoP")
        }
    }

    @Test func aDeviceCodeExchangeNeedsAProof() async throws {
        try await Self.withServers { idp, _ in
            let started = try await TestHTTPClient.post(
                idp.deviceAuthorizationEndpoint, form: [("client_id", idp.clientID), ("scope", "offline_access")])
            let deviceCode = try #require(started.field("device_code"))
            let page = try #require(started.field("verification_uri_complete"))
            #expect(try await idp.decide(.approve, at: page) == 200)
            let fields = [
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"), ("device_code", deviceCode),
                ("client_id", idp.clientID),
            ]
            let bare = try await idp.tokenRequest(fields, proofs: [])
            #expect(bare.status == 400 && bare.field("error") == "invalid_dpop_proof")
            let signer = DPoPTestSigner()
            let proven = try await idp.tokenRequest(fields, proofs: [signer.proof(url: idp.tokenEndpoint)])
            #expect(proven.status == 200 && proven.field("token_type") == "DPoP")
            let token = try #require(proven.field("access_token"))
            #expect(idp.boundThumbprint(ofAccessToken: token) == signer.thumbprint)
        }
    }

    @Test func anIdPIgnoringDPoPAnswersBearerTokensTheServerTakesAsBearer() async throws {
        try await Self.withServers(dpop: false) { idp, server in
            let signer = DPoPTestSigner()
            let plain = try await idp.refresh("rt-0", proof: signer.proof(url: idp.tokenEndpoint))
            #expect(plain.status == 200 && plain.field("token_type") == "Bearer")
            #expect(idp.dpopProofsSeen == 1)

            idp.requireDPoP()
            idp.answerBearer(true)
            let refreshToken = try #require(plain.field("refresh_token"))
            let ignored = try await idp.refresh(refreshToken, proof: signer.proof(url: idp.tokenEndpoint))
            #expect(ignored.status == 200 && ignored.field("token_type") == "Bearer")
            let token = try #require(ignored.field("access_token"))
            #expect(idp.boundThumbprint(ofAccessToken: token) == nil)

            let asBearer = try await server.request(token: token, scheme: "Bearer")
            #expect(asBearer.status == 200)
            let asDPoP = try await server.request(
                token: token, proofs: [signer.proof(method: "GET", url: server.url, accessToken: token)])
            #expect(asDPoP.status == 401 && server.refusals == ["unbound"])
        }
    }
}
