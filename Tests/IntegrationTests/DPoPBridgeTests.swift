import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// DPoP through the real brokerd and brokerctl (docs/dpop.md): an account declared with
/// `dpop = "ES256"` at a test IdP that binds tokens and demands a nonce, and a test resource
/// server that takes a bound token only with a fresh proof of its key for that request.
@Suite struct DPoPBridgeTests {
    /// The broker of `BridgeBroker` with `api` declared DPoP-bound (a public client: its refresh
    /// tokens are bound too), serving a git host and a registry.
    static func start() async throws -> BridgeBroker {
        try await BridgeBroker.start { idp in
            idp.requireDPoP(nonce: true)
            return """
                dpop = "ES256"

                [accounts.api.git]
                hosts = ["git.example"]

                [accounts.api.docker]
                registries = ["registry.example"]
                """
        }
    }

    /// The two header values of `brokerctl header`'s two lines.
    static func headers(_ output: String) throws -> (authorization: String, proof: String) {
        let lines = output.split(separator: "\n", omittingEmptySubsequences: false)
        try #require(lines.count == 3 && lines[2].isEmpty, "exactly two lines")
        try #require(lines[0].hasPrefix("Authorization: DPoP ") && lines[1].hasPrefix("DPoP: "))
        return (String(lines[0].dropFirst("Authorization: ".count)), String(lines[1].dropFirst("DPoP: ".count)))
    }

    /// Sends `headers` to the resource server: `GET` its URL unless told otherwise.
    static func send(
        _ headers: (authorization: String, proof: String), to server: DPoPResourceServer, method: String = "GET"
    ) async throws -> TestHTTPClient.Reply {
        let parts = headers.authorization.split(separator: " ", maxSplits: 1).map(String.init)
        return try await server.request(method, token: parts[1], scheme: parts[0], proofs: [headers.proof])
    }

    @Test func headerAndTokenGiveProofsTheResourceServerTakesOnceAndForTheirRequestOnly() async throws {
        let bridge = try await Self.start()
        let server = try await DPoPResourceServer(idp: bridge.idp)
        defer { Task { await server.shutdown() } }
        defer { Task { await bridge.stop() } }

        let header = try await bridge.run(["header", "api", "--method", "GET", "--url", server.url])
        #expect(header.status == 0, "\(header.stderr)")
        let headers = try Self.headers(header.stdout)
        #expect(try await Self.send(headers, to: server).status == 200)

        // The status shows the key the IdP bound the token to; the IdP's nonce was asked for once.
        let status = try await bridge.run(["status", "api", "--json"])
        let json = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let account = try #require((json["accounts"] as? [[String: Any]])?.first)
        let dpop = try #require(account["dpop"] as? [String: Any])
        #expect(dpop["algorithm"] as? String == "ES256")
        let token = String(headers.authorization.dropFirst("DPoP ".count))
        #expect(dpop["thumbprint"] as? String == bridge.idp.boundThumbprint(ofAccessToken: token))
        #expect(dpop.keys.sorted() == ["algorithm", "thumbprint"], "nothing else of the key")
        #expect(bridge.idp.dpopRefusals == ["nonce"])

        // The server refuses: the same proof again, a proof for another URL or method, the token
        // without a proof or as a bearer token.
        #expect(try await Self.send(headers, to: server).status == 401)
        let elsewhere = try Self.headers(
            try await bridge.run(["header", "api", "--method", "GET", "--url", server.url + "/other"]).stdout)
        #expect(try await Self.send(elsewhere, to: server).status == 401)
        let post = try Self.headers(
            try await bridge.run(["header", "api", "--method", "POST", "--url", server.url]).stdout)
        #expect(try await Self.send(post, to: server, method: "GET").status == 401)
        #expect(try await server.request(token: token).status == 401)
        #expect(try await server.request(token: token, scheme: "Bearer").status == 401)
        #expect(server.refusals == ["replayed", "htu", "htm", "missing", "bearer"])

        // A server that demands a nonce: its 401 names it, and a proof with it passes.
        server.requireNonce()
        let fresh = try Self.headers(
            try await bridge.run(["header", "api", "--method", "GET", "--url", server.url]).stdout)
        let demand = try await Self.send(fresh, to: server)
        #expect(demand.status == 401 && demand.header("WWW-Authenticate")?.contains("use_dpop_nonce") == true)
        let nonce = try #require(demand.header("DPoP-Nonce"))
        let withNonce = try await bridge.run([
            "header", "api", "--method", "GET", "--url", server.url, "--nonce", nonce,
        ])
        #expect(try await Self.send(try Self.headers(withNonce.stdout), to: server).status == 200)

        // `token --dpop-*` gives both as JSON.
        let answer = try await bridge.run([
            "token", "api", "--dpop-method", "GET", "--dpop-url", server.url, "--dpop-nonce", nonce, "--json",
        ])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(answer.stdout.utf8)) as? [String: Any])
        #expect(object["token_type"] as? String == "DPoP")
        let pair = (
            authorization: "DPoP " + (try #require(object["access_token"] as? String)),
            proof: try #require(object["dpop_proof"] as? String)
        )
        #expect(try await Self.send(pair, to: server).status == 200)
        #expect(server.successes == 3)
        bridge.expectNoSecretInOutputs()
    }

    @Test func bearerOnlyBridgesRefuseADPoPAccountAndHandOutNoToken() async throws {
        let bridge = try await Self.start()
        defer { Task { await bridge.stop() } }
        let marker = bridge.broker.root.appendingPathComponent("ran").path
        let results = [
            ("exec", try await bridge.run(["exec", "api", "--", "/usr/bin/touch", marker])),
            ("kube-credential", try await bridge.run(["kube-credential", "api"])),
            ("docker-credential", try await bridge.run(["docker-credential", "get"], stdin: "registry.example")),
            ("header", try await bridge.run(["header", "api"])),
            (
                "git-credential",
                try await bridge.run(["git-credential", "get"], stdin: "protocol=https\nhost=git.example\n\n")
            ),
        ]
        let issued = bridge.idp.issuedAccessTokens
        #expect(!issued.isEmpty, "the account has a token to hand out")
        for (bridgeName, result) in results {
            #expect(result.status != 0, "\(bridgeName) exited 0")
            #expect((result.stdout + result.stderr).contains("DPoP"), "\(bridgeName) does not say why")
            let leaked = issued.contains { result.stdout.contains($0) || result.stderr.contains($0) }
            #expect(!leaked, "\(bridgeName) printed a token")
        }
        #expect(!FileManager.default.fileExists(atPath: marker), "exec ran its command")
        bridge.expectNoSecretInOutputs()
    }

    @Test func aDPoPRequestTheBrokerWouldNotProveIsABadRequest() async throws {
        let bridge = try await Self.start()
        defer { Task { await bridge.stop() } }
        for (method, url) in [
            ("GET", "http://api.example/v1"), ("GET", "ftp://api.example/v1"), ("GET", "/v1"),
            ("GET", "https://api.example/" + String(repeating: "a", count: 2048)), ("G T", "https://api.example/"),
        ] {
            let result = try await bridge.run(["header", "api", "--method", method, "--url", url])
            #expect(result.status != 0 && result.stdout.isEmpty, "\(method) \(url.prefix(40))")
            #expect(result.stderr.contains("dpop"), "\(result.stderr)")
        }
        // The account's own token endpoint: no proof for a program there (forbidden, exit 6).
        let own = try await bridge.run(["header", "api", "--method", "POST", "--url", bridge.idp.tokenEndpoint])
        #expect(own.status != 0 && own.stdout.isEmpty && own.stderr.contains("IdP"), "\(own.stderr)")
        let socketPath = bridge.broker.socketPath
        let answers = try await onOwnThread {
            let connection = try RawConnection(path: socketPath)
            return [
                #"{"id":1,"op":"token","account":"api","dpop":"GET https://api.example/"}"#,
                #"{"id":2,"op":"token","account":"api","dpop":{"htu":"https://api.example/"}}"#,
                #"{"id":3,"op":"token","account":"api","id_token":true,"dpop":{"htm":"GET","htu":"https://a.example/"}}"#,
            ].map { line -> String? in
                _ = connection.send(line + "\n")
                return (connection.readObject()?["error"] as? [String: Any])?["code"] as? String
            }
        }
        #expect(answers == ["bad_request", "bad_request", "bad_request"])
    }

    /// No proof for the IdP's doors (docs/dpop.md), from the real brokerd before and after a
    /// restart: its endpoints in any spelling and the rest of its origin are `forbidden` (exit
    /// 7), but for the URL `dpop_allow` lists; a resource server elsewhere gets a proof whose
    /// `htu` is the normal form of the URL asked for.
    @Test func theIdPsDoorsAreRefusedInEverySpellingBeforeAndAfterARestart() async throws {
        let bridge = try await BridgeBroker.start { idp in
            idp.requireDPoP(nonce: true)
            return """
                dpop = "ES256"
                revocation_endpoint = "\(idp.revocationEndpoint)"
                device_authorization_endpoint = "\(idp.deviceAuthorizationEndpoint)"
                dpop_allow = ["\(idp.tokenEndpoint.dropLast("/token".count))/userinfo"]
                """
        }
        let server = try await DPoPResourceServer(idp: bridge.idp)
        defer { Task { await server.shutdown() } }
        defer { Task { await bridge.stop() } }
        let base = String(bridge.idp.tokenEndpoint.dropLast("/token".count))
        let port = base.split(separator: ":").last ?? ""
        let refused = [
            base + "/token", base + "/%74oken", base + "/./token", base + "/x/../token", base + "//token",
            base + "/token/", "http://localhost:\(port)/token", "HTTP://127.0.0.1:\(port)/token",
            bridge.idp.revocationEndpoint, bridge.idp.deviceAuthorizationEndpoint, base + "/other", base,
        ]
        // The resource's URL spelled otherwise: its proof names the normal form.
        let spelled = server.url.replacing("/items", with: "/x/../%69tems").replacing("http://", with: "HTTP://")
        for round in 0..<2 {
            if round == 1 {
                _ = bridge.broker.stop()
                try await bridge.broker.start()
            }
            for url in refused {
                let result = try await bridge.run(["header", "api", "--method", "POST", "--url", url])
                #expect(result.status == 7 && result.stdout.isEmpty && result.stderr.contains("IdP"), "\(url)")
            }
            let allowed = try await bridge.run(["header", "api", "--method", "GET", "--url", base + "/userinfo"])
            #expect(allowed.status == 0, "\(allowed.stderr)")
            let header = try await bridge.run(["header", "api", "--method", "GET", "--url", spelled])
            let headers = try Self.headers(header.stdout)
            let payload = try #require(headers.proof.split(separator: ".").dropFirst().first)
            let json = try #require(DPoPVerifier.base64URLDecoded(payload))
            let claims = try #require(try JSONSerialization.jsonObject(with: json) as? [String: Any])
            #expect(claims["htu"] as? String == server.url)
            #expect(try await Self.send(headers, to: server).status == 200)
        }
        bridge.expectNoSecretInOutputs()
    }

    /// The declared account got its key with its first tokens; a restart keeps it, and the
    /// Swift client's headers pass the resource server.
    @Test func theKeySurvivesARestartAndTheSwiftClientsHeadersPass() async throws {
        let bridge = try await Self.start()
        let server = try await DPoPResourceServer(idp: bridge.idp)
        defer { Task { await server.shutdown() } }
        defer { Task { await bridge.stop() } }
        let before = try await bridge.broker.client().status(account: "api").first?.dpop?.thumbprint
        #expect(before != nil)
        _ = bridge.broker.stop()
        try await bridge.broker.start()
        let client = try bridge.broker.client()
        #expect(try await client.status(account: "api").first?.dpop?.thumbprint == before)
        _ = try await client.refresh(account: "api")
        let headers = try await client.dpopHeaders(account: "api", method: "GET", url: server.url)
        let reply = try await Self.send((headers.authorization, headers.proof), to: server)
        #expect(reply.status == 200, "\(server.refusals)")
        #expect(bridge.idp.boundThumbprint(ofAccessToken: String(headers.authorization.dropFirst(5))) == before)
        client.close()
    }
}
