import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// Tokens narrowed to a scope (RFC 6749 section 6) or bound to a resource (RFC 8707), against
/// the real brokerd and a test IdP that rotates refresh tokens, holds scopes to the original
/// grant and records every refresh.
@Suite struct ScopedTokenTests {
    /// What every test here starts with: brokerd, an IdP whose original grant is
    /// `read write admin audit`, and account `api` holding a valid token of that scope and the
    /// IdP's current refresh token (so nothing refreshes until asked).
    struct Setup {
        let broker: BrokerProcess
        let idp: OAuth2TestIdP
        let client: BrokerClient
        static let refreshToken = "rt-scoped-\(UInt32.random(in: 0...UInt32.max))"

        /// Runs `body` against a fresh setup, then stops brokerd (waiting for it) and the IdP.
        static func run(_ body: (Setup) async throws -> Void) async throws {
            try await runThenStop(try await start(), stop: { await $0.stop() }, body)
        }

        private static func start(lifetime: Int = 3600) async throws -> Setup {
            let idp = try await OAuth2TestIdP(initialRefreshToken: refreshToken, lifetime: lifetime)
            idp.setOriginalGrant(scope: "read write admin audit")
            let broker = try BrokerProcess()
            try await broker.start()
            let client = try broker.client()
            _ = try await client.add(
                account: "api",
                provider: idp.provider(),
                tokens: TokenSet(
                    accessToken: "at-default", expiresIn: 3600, refreshToken: refreshToken,
                    scope: "read write admin audit"))
            return Setup(broker: broker, idp: idp, client: client)
        }

        func stop() async {
            client.close()
            _ = broker.stop()
            await idp.shutdown()
        }

        /// Every refresh presented the refresh token the one before it left (none reused).
        func expectOneChain(sourceLocation: SourceLocation = #_sourceLocation) {
            let calls = idp.refreshCalls
            let presented = calls.map(\.refreshToken)
            let expected = [Self.refreshToken] + idp.issuedRefreshTokens.dropLast()
            #expect(presented == expected.map(Optional.some), sourceLocation: sourceLocation)
            #expect(calls.allSatisfy { $0.presentedCurrent }, sourceLocation: sourceLocation)
            #expect(idp.rejectedReuse == 0, sourceLocation: sourceLocation)
        }

        /// Neither the brokerd log nor `texts` holds a refresh token or the client secret.
        func expectNoSecret(in texts: [String] = [], sourceLocation: SourceLocation = #_sourceLocation) {
            let secrets = [Self.refreshToken, idp.clientSecret] + idp.issuedRefreshTokens
            // Checked outside #expect, whose failure message would print the secrets.
            let leaked = (texts + [broker.log]).contains { text in secrets.contains { text.contains($0) } }
            #expect(!leaked, "a refresh token or the client secret in an output", sourceLocation: sourceLocation)
        }
    }

    /// Floor 4: 200 concurrent requests over 4 scope sets make exactly 4 refreshes, one after
    /// another on the one refresh-token chain, and each answer carries its own scope; the same
    /// requests again are answered from the cache.
    @Test func twoHundredRequestsOverFourScopeSetsMakeFourChainedRefreshes() async throws {
        try await Setup.run { setup in
            setup.idp.setDelay(.milliseconds(200))
            let clients = try (0..<20).map { _ in try setup.broker.client() }
            defer { clients.forEach { $0.close() } }
            let scopeSets = ["read", "write", "read write", "admin audit"]

            func round() async throws -> [(asked: String, answer: TokenResult)] {
                try await withThrowingTaskGroup(of: (String, TokenResult).self) { group in
                    for index in 0..<200 {
                        let client = clients[index % clients.count]
                        let scope = scopeSets[index % scopeSets.count]
                        group.addTask { (scope, try await client.token(account: "api", minTTL: 60, scope: scope)) }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
            }

            let first = try await round()
            #expect(first.count == 200)
            #expect(setup.idp.refreshCalls.count == 4, "one refresh per scope set")
            setup.expectOneChain()
            #expect(Set(setup.idp.refreshCalls.compactMap(\.scope)) == Set(scopeSets))
            for (asked, answer) in first {
                #expect(answer.scope == asked, "each answer carries the scope its request asked for")
            }
            let tokensBySet = Dictionary(grouping: first, by: \.asked).mapValues { Set($0.map(\.answer.accessToken)) }
            #expect(tokensBySet.values.allSatisfy { $0.count == 1 }, "one token per scope set")
            #expect(Set(tokensBySet.values.flatMap { $0 }) == Set(setup.idp.issuedAccessTokens))

            let second = try await round()
            #expect(setup.idp.refreshCalls.count == 4, "the second round is answered from the cache")
            #expect(second.allSatisfy { tokensBySet[$0.asked] == [$0.answer.accessToken] })

            // The account's own token was not touched, and its vault holds the chain's last link:
            // a restarted broker refreshes with it.
            #expect(try await setup.client.token(account: "api").accessToken == "at-default")
            setup.broker.stop()
            try await setup.broker.start()
            let restarted = try setup.broker.client()
            defer { restarted.close() }
            _ = try await restarted.refresh(account: "api")
            #expect(setup.idp.refreshCalls.count == 5)
            setup.expectOneChain()
            setup.expectNoSecret()
        }
    }

    /// A scope beyond the original grant, or a resource the IdP does not serve, is `forbidden`
    /// with the IdP's reason; the account stays valid, keeps serving its own token, and no
    /// failure event is sent.
    @Test func refusedScopeIsForbiddenAndLeavesTheAccountAlone() async throws {
        try await Setup.run { setup in
            setup.idp.setResources(["https://api.example.com/"])
            let events = try await setup.client.events(accounts: ["api"])

            let refused = await #expect(throws: BrokerError.self) {
                try await setup.client.token(account: "api", scope: "read delete")
            }
            #expect(refused?.code == .forbidden)
            #expect(refused?.message.contains("invalid_scope: scope delete was not granted") == true)
            let target = await #expect(throws: BrokerError.self) {
                try await setup.client.token(account: "api", resource: "https://elsewhere.example/")
            }
            #expect(target?.code == .forbidden)
            #expect(target?.message.contains("invalid_target") == true)

            let status = try #require(try await setup.client.status(account: "api").first)
            #expect(status.state == "valid")
            #expect(status.lastError == nil)
            #expect(try await setup.client.token(account: "api").accessToken == "at-default")
            // The refused refreshes consumed nothing: the next one presents the same refresh token.
            let narrowed = try await setup.client.token(account: "api", scope: "read")
            #expect(narrowed.scope == "read")
            let calls = setup.idp.refreshCalls
            #expect(calls.map(\.refreshToken) == Array(repeating: Setup.refreshToken, count: 3))
            #expect(calls.allSatisfy { $0.presentedCurrent } && setup.idp.rejectedReuse == 0)

            // The first event after the refusals is the refresh asked for now, not a failure.
            _ = try await setup.client.refresh(account: "api")
            var iterator = events.makeAsyncIterator()
            let event = try await iterator.next()
            #expect(event?.event == .refreshed)
            setup.expectNoSecret(in: [refused?.message ?? "", target?.message ?? ""])
        }
    }

    /// A transient failure of a narrowed refresh makes that key wait out the IdP's Retry-After,
    /// answering `unavailable` without calling the IdP again; the account does not back off.
    @Test func transientFailureBacksOffTheKeyNotTheAccount() async throws {
        try await Setup.run { setup in
            setup.idp.setBehavior(.status(503, retryAfter: 30))
            for _ in 0..<3 {
                let error = await #expect(throws: BrokerError.self) {
                    try await setup.client.token(account: "api", scope: "read")
                }
                #expect(error?.code == .unavailable)
                #expect((1...30_000).contains(error?.retryAfterMs ?? 0), "the IdP's Retry-After, counting down")
            }
            #expect(setup.idp.refreshCalls.count == 1, "one IdP call, then the key waits")
            setup.idp.setBehavior(.normal)
            #expect(try await setup.client.token(account: "api", scope: "write").scope == "write")
            let status = try #require(try await setup.client.status(account: "api").first)
            #expect(status.state == "valid" && status.lastError == nil)
            #expect(try await setup.client.token(account: "api").accessToken == "at-default")
        }
    }

    /// The resource goes to the IdP with the refresh and keys a token of its own; the account's
    /// configured scope is asked for when the request names none.
    @Test func resourceIsSentAndKeysItsOwnToken() async throws {
        try await Setup.run { setup in
            let resource = "https://api.example.com/v1?tenant=7"
            let bound = try await setup.client.token(account: "api", resource: resource)
            let call = try #require(setup.idp.refreshCalls.last)
            #expect(call.resource == resource)
            #expect(call.scope == nil, "no scope asked for and none configured")
            #expect(bound.scope == "admin audit read write", "the IdP's granted scope")

            let scoped = try await setup.client.token(account: "api", scope: "read", resource: resource)
            #expect(setup.idp.refreshCalls.last?.scope == "read")
            #expect(setup.idp.refreshCalls.last?.resource == resource)
            #expect(scoped.accessToken != bound.accessToken)
            #expect(try await setup.client.token(account: "api", resource: resource).accessToken == bound.accessToken)
            #expect(setup.idp.refreshCalls.count == 2)
            setup.expectOneChain()
        }
    }

    /// Rejecting a narrowed token drops it and refreshes its key once, however many reject it.
    @Test func rejectOfANarrowedTokenRefreshesThatKeyOnce() async throws {
        try await Setup.run { setup in
            setup.idp.setDelay(.milliseconds(200))
            let refused = try await setup.client.token(account: "api", scope: "write")
            #expect(setup.idp.refreshCalls.count == 1)
            let clients = try (0..<5).map { _ in try setup.broker.client() }
            defer { clients.forEach { $0.close() } }

            let answers = try await withThrowingTaskGroup(of: TokenResult.self) { group in
                for index in 0..<20 {
                    let client = clients[index % clients.count]
                    group.addTask {
                        try await client.reject(account: "api", accessToken: refused.accessToken, scope: "write")
                    }
                }
                return try await group.reduce(into: [TokenResult]()) { $0.append($1) }
            }
            #expect(setup.idp.refreshCalls.count == 2, "one refresh for every reject of the same token")
            #expect(setup.idp.refreshCalls.last?.scope == "write")
            #expect(Set(answers.map(\.accessToken)) == [setup.idp.issuedAccessTokens[1]])
            #expect(answers.allSatisfy { $0.scope == "write" })
            #expect(try await setup.client.token(account: "api").accessToken == "at-default")
            setup.expectOneChain()
        }
    }

    /// Scope order and repeats do not matter: one key, one refresh, one token.
    @Test func scopeOrderAndRepeatsNameOneToken() async throws {
        try await Setup.run { setup in
            let first = try await setup.client.token(account: "api", scope: "write read read")
            let second = try await setup.client.token(account: "api", scope: " read  write ")
            #expect(first.accessToken == second.accessToken)
            #expect(first.scope == "read write")
            #expect(setup.idp.refreshCalls.map(\.scope) == ["read write"])
        }
    }

    /// `scope` and `resource` are checked, and refused for kinds that cannot narrow a token.
    @Test func badScopesAndOtherKindsAreBadRequests() async throws {
        try await Setup.run { setup in
            _ = try await setup.client.add(
                account: "pushed", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: "tok-static", expiresIn: 600))
            let cases: [(String, String?, String?, String)] = [
                ("pushed", "read", nil, "apply only to oauth2 accounts"),
                ("pushed", nil, "https://api.example.com/", "apply only to oauth2 accounts"),
                ("api", "", nil, "names no scope"),
                ("api", "read \"write\"", nil, "printable ASCII"),
                ("api", "read\twrite", nil, "printable ASCII"),
                ("api", String(repeating: "s", count: 1025), nil, "longer than 1024"),
                ("api", (0..<33).map { "s\($0)" }.joined(separator: " "), nil, "more than 32"),
                ("api", nil, "/relative/path", "absolute URI"),
                ("api", nil, "https://api.example.com/#part", "fragment"),
                ("api", nil, "https://api.example.com/ space", "absolute URI"),
            ]
            for (account, scope, resource, reason) in cases {
                let error = await #expect(throws: BrokerError.self) {
                    try await setup.client.token(account: account, scope: scope, resource: resource)
                }
                #expect(error?.code == .badRequest, "\(scope ?? "") \(resource ?? "")")
                #expect(error?.message.contains(reason) == true, "\(error?.message ?? "")")
            }
            #expect(setup.idp.refreshCalls.isEmpty)
        }
    }

    /// `brokerctl token --scope --resource` prints the narrowed token; `--json` shows the
    /// granted scope; a refusal exits 7 with the IdP's reason; no refresh token is printed.
    @Test func brokerctlTokenAndBridgesWithScopeEndToEnd() async throws {
        try await Setup.run { setup in
            let resource = "https://api.example.com/"
            let printed = try await setup.broker.brokerctl([
                "token", "api", "--scope", "read write", "--resource", resource,
            ])
            #expect(printed.status == 0, "\(printed.stderr)")
            #expect(printed.stdout == (setup.idp.issuedAccessTokens.last ?? "-") + "\n")
            #expect(setup.idp.refreshCalls.last?.resource == resource)

            let json = try await setup.broker.brokerctl(["token", "api", "--scope", "write read", "--json"])
            let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
            #expect(object?["scope"] as? String == "read write")
            #expect(setup.idp.refreshCalls.count == 2, "another resource is another token")

            let refused = try await setup.broker.brokerctl(["token", "api", "--scope", "delete"])
            #expect(refused.status == 7)
            #expect(refused.stderr.contains("scope delete was not granted"))
            let mixed = try await setup.broker.brokerctl(["token", "api", "--id-token", "--scope", "read"])
            #expect(mixed.status != 0)
            #expect(try await setup.broker.brokerctl(["token", "api"]).stdout == "at-default\n")

            // The bridges that take the options ask for the same narrowed token, from the cache.
            let callsBefore = setup.idp.refreshCalls.count
            let header = try await setup.broker.brokerctl(["header", "api", "--scope", "write read"])
            #expect(header.stdout == "Authorization: Bearer \(object?["access_token"] as? String ?? "-")\n")
            #expect(setup.idp.refreshCalls.count == callsBefore, "the header's token came from the cache")
            let kube = try await setup.broker.brokerctl([
                "kube-credential", "api", "--scope", "read", "--resource", resource,
            ])
            #expect(kube.status == 0, "\(kube.stderr)")
            #expect(kube.stdout.contains("\"token\":\"\(setup.idp.issuedAccessTokens.last ?? "-")\""))
            #expect(setup.idp.refreshCalls.last?.scope == "read")
            #expect(setup.idp.refreshCalls.count == callsBefore + 1, "kube-credential's key is a new one")
            let exec = try await setup.broker.brokerctl(
                ["exec", "api", "--scope", "delete", "--", "true"])
            #expect(exec.status == 7, "a refused scope stops exec before the command runs")
            setup.expectNoSecret(in: [
                printed.stdout, printed.stderr, json.stdout, refused.stdout, refused.stderr, header.stderr, kube.stderr,
                exec.stdout, exec.stderr,
            ])
        }
    }

    /// An IdP that narrows the whole chain on a narrowed refresh (django-oauth-toolkit) shows in
    /// `status`: the account's own next token lacks the scope, and `lost_scope` names it.
    @Test func statusShowsAScopeTheIdPNarrowed() async throws {
        try await Setup.run { setup in
            setup.idp.setNarrowsChain(true)
            #expect(try await setup.client.status(account: "api").first?.lostScope == nil)
            _ = try await setup.client.token(account: "api", scope: "read write")
            _ = try await setup.client.refresh(account: "api")
            let status = try #require(try await setup.client.status(account: "api").first)
            #expect(status.state == "valid")
            #expect(status.lostScope == "admin audit")
            #expect(try await setup.client.token(account: "api").scope == "read write")
            let table = try await setup.broker.brokerctl(["status"])
            #expect(table.stdout.contains("api: the IdP no longer grants the scope admin audit"))
        }
    }
}
