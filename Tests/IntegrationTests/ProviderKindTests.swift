import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The provider kinds beyond plain `oauth2`, end to end: real brokerd, real socket, and a real
/// IdP for each (HTTP servers on 127.0.0.1, or a real executable for `exec`).
@Suite struct ProviderKindTests {
    // MARK: refresh_url

    @Test(arguments: ["GET", "POST"])
    func refreshURLAccountsRefreshOnTheirOwnRotateTheURLAndStopWhenItIsRefused(method: String) async throws {
        let idp = try await RefreshURLTestIdP(lifetime: 3)
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        var provider = ProviderSpec(kind: "refresh_url")
        provider["method"] = .string(method)
        _ = try await client.add(account: "pph", provider: provider, tokens: TokenSet(refreshURL: idp.initialURL))

        // Initial refresh: the account had only its refresh URL.
        let first = try await client.token(account: "pph", minTTL: 1)
        #expect(idp.issuedAccessTokens.contains(first.accessToken))

        // Scheduled refreshes: nobody asks, the 3-second tokens are renewed anyway (counted from
        // the first answer, which a loaded test process may get late).
        let issuedBefore = idp.issuedAccessTokens.count
        #expect(await eventually(timeout: 25) { idp.issuedAccessTokens.count >= issuedBefore + 3 })
        let later = try await client.token(account: "pph", minTTL: 0)
        #expect(later.accessToken != first.accessToken)
        #expect(idp.issuedAccessTokens.contains(later.accessToken))

        // Rotation: every call used the URL the previous call handed out; none was reused.
        let calls = idp.calls
        let issued = idp.issuedURLs
        #expect(calls.map(\.url) == Array(([idp.initialURL] + issued).prefix(calls.count)))
        #expect(calls.allSatisfy { $0.method == method })
        #expect(idp.rejectedReuse == 0)

        // Denial: the session is revoked; the next refresh gets 401 and the account needs a login.
        idp.revoke()
        #expect(try await eventually { try await client.status(account: "pph").first?.state == "needs_login" })
        let refused = await #expect(throws: BrokerError.self) { try await client.token(account: "pph", minTTL: 1) }
        #expect(refused?.code == .needsLogin)
        // That no IdP call follows a denial is DeniedAccountTests' (on a clock the test moves).

        // A new login (set_tokens with a fresh URL) brings it back.
        let fresh = idp.reissue()
        _ = try await client.setTokens(account: "pph", tokens: TokenSet(refreshURL: fresh))
        let recovered = try await client.token(account: "pph", minTTL: 1)
        #expect(idp.issuedAccessTokens.contains(recovered.accessToken))
        #expect(idp.calls.contains { $0.url == fresh })

        // The URLs are secrets: not in any message, not in the log, not in plaintext on disk.
        let status = try await client.status(account: "pph")
        let statusText = String(decoding: try JSONEncoder().encode(status), as: UTF8.self)
        client.close()
        #expect(broker.stop() == 0)
        await idp.shutdown()
        let secrets = ([idp.initialURL, fresh] + idp.issuedURLs).map { $0.components(separatedBy: "/refresh/")[1] }
        for secret in secrets {
            #expect(!broker.log.contains(secret), "a refresh URL in the broker's log")
            #expect(!statusText.contains(secret))
            for file in broker.storedFiles() {
                #expect(!file.bytes.contains(secret), "plaintext refresh URL in \(file.path)")
            }
        }
    }

    // MARK: sliding

    @Test func slidingAccountsRotateOnEveryRefreshAndAReusedTokenMeansLogin() async throws {
        let initial = "srt-\(UInt32.random(in: 0...UInt32.max))"
        // Tokyo is UTC+9: zone-less timestamps read as UTC would be nine hours off.
        let idp = try await SlidingTestIdP(
            initialRefreshToken: initial, accessLifetime: 3, refreshLifetime: 3600, timeZone: "Asia/Tokyo")
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        var provider = ProviderSpec(kind: "sliding")
        provider["endpoint"] = .string(idp.endpoint)
        provider["timezone"] = "Asia/Tokyo"
        _ = try await client.add(account: "volt", provider: provider, tokens: TokenSet(refreshToken: initial))

        let first = try await client.token(account: "volt", minTTL: 1)
        #expect(idp.issuedAccessTokens.contains(first.accessToken))
        #expect(await eventually(timeout: 25) { idp.issuedAccessTokens.count >= 4 })

        let status = try #require(try await client.status(account: "volt").first)
        let refreshExpiresAt = try #require(status.refreshExpiresAt)
        #expect(abs(refreshExpiresAt.timeIntervalSinceNow - 3600) < 120, "zone-less expiry read in the configured zone")
        let expiresAt = try #require(status.expiresAt)
        #expect(expiresAt.timeIntervalSinceNow < 5)

        let calls = idp.calls
        let issued = idp.issuedRefreshTokens
        #expect(calls.map(\.refreshToken) == Array(([initial] + issued).prefix(calls.count)))
        #expect(calls.allSatisfy { $0.method == "POST" })
        #expect(idp.rejectedReuse == 0)
        #expect(idp.rejectedExpired == 0)

        // Pushing back a refresh token that was already used: the endpoint answers
        // {"status": false, "message": "RefreshTokenMismatch"} and the account needs a login.
        _ = try await client.setTokens(account: "volt", tokens: TokenSet(refreshToken: initial))
        let refused = await #expect(throws: BrokerError.self) { try await client.refresh(account: "volt") }
        #expect(refused?.code == .needsLogin)
        let denied = try #require(try await client.status(account: "volt").first)
        #expect(denied.state == "needs_login")
        #expect(denied.lastError?.message.contains("RefreshTokenMismatch") == true)
        #expect(idp.rejectedReuse >= 1)

        client.close()
        #expect(broker.stop() == 0)
        await idp.shutdown()
        for secret in [initial] + idp.issuedRefreshTokens {
            #expect(!broker.log.contains(secret), "a refresh token in the broker's log")
            for file in broker.storedFiles() {
                #expect(!file.bytes.contains(secret), "plaintext refresh token in \(file.path)")
            }
        }
    }

    /// Seed 004's sliding window: the refresh token lapses long before the access token, so
    /// the broker must refresh on its own before it does, with no client asking.
    @Test func slidingRefreshTokensAreKeptAliveWithoutAnyClient() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let initial = "srt-\(UInt32.random(in: 0...UInt32.max))"
        // Sao Paulo is UTC-3: zone-less timestamps read as UTC would already have lapsed.
        let idp = try await SlidingTestIdP(
            initialRefreshToken: initial, accessLifetime: 3600, refreshLifetime: 40, timeZone: "America/Sao_Paulo")
        let client = try broker.client()
        var provider = ProviderSpec(kind: "sliding")
        provider["endpoint"] = .string(idp.endpoint)
        provider["timezone"] = "America/Sao_Paulo"
        var tokens = TokenSet(accessToken: "sl-pushed", expiresIn: 3600, refreshToken: initial)
        tokens.refreshExpiresAt = idp.initialRefreshExpiresAt
        _ = try await client.add(account: "volt", provider: provider, tokens: tokens)
        client.close()

        // Nobody asks for a token; the access token is good for an hour. Each refresh token
        // lives 40 s (the first one counts from the IdP's start, which a loaded machine may
        // take seconds to get past; the in-process IdP shares the test process with every
        // other suite, and 20 s left too little room in two CI runs), so three refreshes in a
        // row mean the window was kept open.
        #expect(await eventually(timeout: 150) { idp.issuedRefreshTokens.count >= 3 })
        #expect(idp.rejectedExpired == 0, "the broker let a refresh token lapse")
        #expect(idp.rejectedReuse == 0)
        let calls = idp.calls
        let issued = idp.issuedRefreshTokens
        #expect(calls.map(\.refreshToken) == Array(([initial] + issued).prefix(calls.count)))

        let reader = try broker.client()
        defer { reader.close() }
        let token = try await reader.token(account: "volt", minTTL: 60)
        #expect(idp.issuedAccessTokens.contains(token.accessToken))
        let status = try #require(try await reader.status(account: "volt").first)
        #expect(status.state == "valid" || status.state == "refreshing")
        let refreshExpiresAt = try #require(status.refreshExpiresAt)
        #expect(refreshExpiresAt.timeIntervalSinceNow > -1 && refreshExpiresAt.timeIntervalSinceNow <= 41)
        await idp.shutdown()
    }

    // MARK: exec

    @Test func execAccountsRunTheCommandOnScheduleWithArgumentsVerbatim() async throws {
        let broker = try BrokerProcess()
        let helper = try Helper(in: broker.root)
        helper.set("lifetime", "3")
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        var provider = ProviderSpec(kind: "exec")
        provider["command"] = [.string(helper.script), .string(helper.directory), "two words", "$HOME;echo pwned", "*"]
        _ = try await client.add(account: "cred", provider: provider)

        let first = try await client.token(account: "cred", minTTL: 1)
        #expect(first.accessToken.hasPrefix("exec-at-"))
        #expect(first.tokenType == "Bearer")
        // At least two scheduled runs after the one that issued `first` (a slow machine may
        // already have needed several runs to get a token valid for min_ttl).
        let runs = max(4, helper.calls.count + 2)
        #expect(await eventually(timeout: 25) { helper.calls.count >= runs }, "the command ran on schedule")
        let later = try await client.token(account: "cred", minTTL: 0)
        #expect(later.accessToken != first.accessToken)

        let calls = helper.calls
        #expect(calls.allSatisfy { $0.arguments == "two words $HOME;echo pwned *" }, "argv reached it verbatim")
        // Every run was waited for: none is left, not even as a zombie.
        for call in calls.dropLast() {
            #expect(await eventually(timeout: 5) { isGone(call.pid) }, "pid \(call.pid) was not waited for")
        }

        // Exit code 2 is a denial; the command's stderr goes to the log, never to the client.
        helper.set("mode", "deny-exit")
        #expect(try await eventually { try await client.status(account: "cred").first?.state == "needs_login" })
        let refused = await #expect(throws: BrokerError.self) { try await client.token(account: "cred", minTTL: 1) }
        #expect(refused?.code == .needsLogin)
        let denied = try #require(try await client.status(account: "cred").first)
        #expect(denied.lastError?.message.contains("denied") == true)
        #expect(denied.lastError?.message.contains("stderr-marker") == false)
        #expect(broker.log.contains("stderr-marker-"), "the command's stderr is in the broker's log")

        // New tokens clear needs_login; a JSON "invalid_grant" (with exit 1) is a denial too.
        helper.set("mode", "ok")
        _ = try await client.setTokens(account: "cred", tokens: TokenSet(accessToken: "pushed", expiresIn: 0))
        #expect(try await client.token(account: "cred", minTTL: 1).accessToken.hasPrefix("exec-at-"))
        helper.set("mode", "deny-json")
        #expect(try await eventually { try await client.status(account: "cred").first?.state == "needs_login" })
        #expect(try await client.status(account: "cred").first?.lastError?.message.contains("invalid_grant") == true)
    }

    @Test func execFailuresThatAreNotDenialsKeepServingAndAreRetried() async throws {
        let broker = try BrokerProcess()
        try FileManager.default.createDirectory(at: broker.configDirectory, withIntermediateDirectories: true)
        try "[broker]\nrequest_timeout = 2\nbackoff_cap = 2\n".write(
            to: broker.configDirectory.appendingPathComponent("broker.toml"), atomically: true, encoding: .utf8)
        let helper = try Helper(in: broker.root)
        helper.set("lifetime", "3600")
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        var provider = ProviderSpec(kind: "exec")
        provider["command"] = [.string(helper.script), .string(helper.directory)]
        _ = try await client.add(account: "cred", provider: provider)
        let served = try await client.token(account: "cred", minTTL: 60)

        for mode in ["fail", "garbage", "hang"] {
            helper.set("mode", mode)
            let failed = await #expect(throws: BrokerError.self, "mode \(mode)") {
                try await client.refresh(account: "cred")
            }
            #expect(failed?.code == .unavailable, "mode \(mode)")
            #expect(failed?.retryAfterMs != nil, "mode \(mode)")
            #expect(failed?.message.contains("stderr-marker") == false)
            let status = try #require(try await client.status(account: "cred").first)
            // "refreshing" when a jittered background retry (full jitter may pick almost no delay)
            // has already started; either way the current token is still served.
            #expect(["stale", "refreshing"].contains(status.state), "mode \(mode): \(status.state)")
            #expect(try await client.token(account: "cred", minTTL: 60).accessToken == served.accessToken)
        }
        // The hung command was killed at the timeout and waited for. (A `refresh` joins a
        // background retry already under way, which may have started in the previous mode, so
        // the hung call can come from the next retry.)
        #expect(await eventually(timeout: 10) { helper.calls.contains { $0.mode == "hang" } })
        let hung = try #require(helper.calls.last { $0.mode == "hang" })
        #expect(await eventually(timeout: 10) { isGone(hung.pid) }, "the timed-out command was not reaped")
        #expect(broker.log.contains("stderr-marker-"))

        helper.set("mode", "ok")
        // A scheduled retry of the last failure may still be under way; the next refresh works.
        #expect(await eventually { (try? await client.refresh(account: "cred")) != nil })
        let recovered = try await client.token(account: "cred", minTTL: 60)
        #expect(recovered.accessToken != served.accessToken)
        #expect(try await client.status(account: "cred").first?.state == "valid")
    }

    // MARK: oauth2 with an OIDC issuer

    @Test func oauth2AccountsFindTheirTokenEndpointThroughDiscoveryOnce() async throws {
        let refreshToken = "rt-oidc-\(UInt32.random(in: 0...UInt32.max))"
        let idp = try await OAuth2TestIdP(initialRefreshToken: refreshToken, lifetime: 3)
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        _ = try await client.add(
            account: "oidc",
            provider: ProviderSpec(
                kind: "oauth2", ["issuer": .string(idp.issuer), "client_id": .string(idp.clientID)]),
            tokens: TokenSet(refreshToken: refreshToken))
        let first = try await client.token(account: "oidc", minTTL: 1)
        #expect(idp.issuedAccessTokens.contains(first.accessToken))
        #expect(await eventually(timeout: 25) { idp.issuedAccessTokens.count >= 4 })
        #expect(idp.discoveryCount == 1, "the discovered endpoint is cached")
        #expect(idp.rejectedReuse == 0)
        client.close()

        // A fresh broker process has an empty cache; a broken discovery is transient.
        #expect(broker.stop() == 0)
        idp.setDiscoveryBehavior(.status(503, retryAfter: nil))
        try await broker.start()
        let restarted = try broker.client()
        defer { restarted.close() }
        let failed = await #expect(throws: BrokerError.self) { try await restarted.refresh(account: "oidc") }
        #expect(failed?.code == .unavailable)
        #expect(try await restarted.status(account: "oidc").first?.state != "needs_login")
        idp.setDiscoveryBehavior(.normal)
        #expect(await eventually { (try? await restarted.refresh(account: "oidc")) != nil })
        #expect(idp.issuedAccessTokens.contains(try await restarted.token(account: "oidc", minTTL: 1).accessToken))
        #expect(idp.rejectedReuse == 0)
        await idp.shutdown()
    }

    // MARK: file

    /// A token file another program keeps: added at runtime or declared in the config, served,
    /// re-read when rewritten, refused (last good token still served) when others could write
    /// it, and never copied into the log. (`brokerctlAddsEveryKind` adds one with brokerctl.)
    @Test func fileAccountsServeATokenFileAndFollowItsRewrites() async throws {
        let broker = try BrokerProcess()
        let tokens = broker.root.appendingPathComponent("home/tokens")
        try FileManager.default.createDirectory(at: tokens, withIntermediateDirectories: true)
        chmod(tokens.path, 0o700)
        let path = tokens.appendingPathComponent("api.json").path
        let declaredPath = tokens.appendingPathComponent("declared.json").path
        let marker = UInt32.random(in: 0...UInt32.max)
        /// Replaces a token file the way a careful cron job does: a new file renamed over it.
        func write(_ token: String, to file: String) throws {
            let staging = file + ".new"
            try Data(#"{"access_token":"\#(token)","expires_in":3600,"token_type":"Bearer"}"#.utf8)
                .write(to: URL(fileURLWithPath: staging))
            chmod(staging, 0o600)
            #expect(rename(staging, file) == 0)
        }
        try write("at-file-1-\(marker)", to: path)
        try write("at-declared-\(marker)", to: declaredPath)
        try broker.writeConfig("[accounts.declared]\nkind = \"file\"\npath = \"\(declaredPath)\"\n")
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }

        _ = try await client.add(account: "cron", provider: ProviderSpec(kind: "file", ["path": .string(path)]))
        #expect(try await client.token(account: "cron").accessToken == "at-file-1-\(marker)")
        #expect(try await client.token(account: "declared").accessToken == "at-declared-\(marker)")
        let status = try #require(try await client.status(account: "cron").first)
        #expect(status.provider == "file" && status.state == "valid")

        // Rewritten: the broker's poll picks the new token up, no client needs to ask.
        try write("at-file-2-\(marker)", to: path)
        #expect(try await eventually { try await client.token(account: "cron").accessToken == "at-file-2-\(marker)" })

        // Writable by others: refused with a message naming the file; the last good token stays.
        chmod(path, 0o666)
        #expect(
            try await eventually {
                try await client.status(account: "cron").first?.lastError?.message.contains(path) == true
            })
        #expect(try await client.status(account: "cron").first?.state == "stale")
        #expect(try await client.token(account: "cron").accessToken == "at-file-2-\(marker)")

        // Fixed: served and valid again.
        try write("at-file-3-\(marker)", to: path)
        #expect(try await eventually { try await client.token(account: "cron").accessToken == "at-file-3-\(marker)" })
        #expect(try await client.status(account: "cron").first?.state == "valid")

        client.close()
        #expect(broker.stop() == 0)
        #expect(!broker.log.contains("at-file-"), "a file's token in the broker's log")
        #expect(!broker.log.contains("at-declared-"))
    }

    // MARK: brokerctl

    /// `brokerctl add` takes every kind's options; secrets (the refresh URL included) come on stdin.
    @Test func brokerctlAddsEveryKind() async throws {
        let urlIdP = try await RefreshURLTestIdP(lifetime: 3600)
        let slidingIdP = try await SlidingTestIdP(initialRefreshToken: "srt-ctl", timeZone: "Europe/Berlin")
        let oauthIdP = try await OAuth2TestIdP(initialRefreshToken: "rt-ctl", lifetime: 3600)
        let broker = try BrokerProcess()
        let helper = try Helper(in: broker.root)
        helper.set("lifetime", "3600")
        let tokenFile = broker.root.appendingPathComponent("home/token.json").path
        try Data(#"{"access_token":"at-file-ctl","expires_in":3600}"#.utf8).write(to: URL(fileURLWithPath: tokenFile))
        chmod(tokenFile, 0o600)
        try await broker.start()
        defer { broker.stop() }

        let added = [
            try await broker.brokerctl(
                ["add", "pph", "--kind", "refresh_url", "--method", "post", "--secrets", "-"],
                stdin: #"{"refresh_url":"\#(urlIdP.initialURL)"}"#),
            try await broker.brokerctl(
                [
                    "add", "volt", "--kind", "sliding", "--endpoint", slidingIdP.endpoint, "--timezone",
                    "Europe/Berlin",
                    "--secrets", "-",
                ],
                stdin: #"{"refresh_token":"srt-ctl"}"#),
            try await broker.brokerctl(
                [
                    "add", "cred", "--kind", "exec", "--command", helper.script, "--command", helper.directory,
                    "--command", "--not-an-option",
                ]),
            try await broker.brokerctl(
                [
                    "add", "oidc", "--kind", "oauth2", "--issuer", oauthIdP.issuer, "--client-id", oauthIdP.clientID,
                    "--secrets", "-",
                ],
                stdin: #"{"refresh_token":"rt-ctl"}"#),
            try await broker.brokerctl(["add", "nightly", "--kind", "file", "--path", tokenFile]),
        ]
        for result in added { #expect(result.status == 0, "\(result.stderr)") }

        #expect(try await broker.brokerctl(["token", "pph"]).stdout == (urlIdP.issuedAccessTokens.first ?? "?") + "\n")
        #expect(urlIdP.calls.first?.method == "POST")
        #expect(
            try await broker.brokerctl(["token", "volt"]).stdout == (slidingIdP.issuedAccessTokens.first ?? "?") + "\n")
        #expect(try await broker.brokerctl(["token", "cred"]).stdout.hasPrefix("exec-at-1-"))
        #expect(helper.calls.first?.arguments == "--not-an-option")
        #expect(
            try await broker.brokerctl(["token", "oidc"]).stdout == (oauthIdP.issuedAccessTokens.first ?? "?") + "\n")
        #expect(oauthIdP.discoveryCount == 1)
        #expect(try await broker.brokerctl(["token", "nightly"]).stdout == "at-file-ctl\n")

        let status = try await broker.brokerctl(["status"])
        for kind in ["refresh_url", "sliding", "exec", "oauth2", "file"] { #expect(status.stdout.contains(kind)) }

        let relative = try await broker.brokerctl(["add", "bad", "--kind", "exec", "--command", "get-token"])
        #expect(relative.status == 1)
        #expect(relative.stderr.contains("absolute"))
        let noEndpoint = try await broker.brokerctl(["add", "bad", "--kind", "sliding"])
        #expect(noEndpoint.status == 1)
        #expect(noEndpoint.stderr.contains("endpoint"))
        let relativePath = try await broker.brokerctl(["add", "bad", "--kind", "file", "--path", "token.json"])
        #expect(relativePath.status == 1)
        #expect(relativePath.stderr.contains("absolute"))

        await urlIdP.shutdown()
        await slidingIdP.shutdown()
        await oauthIdP.shutdown()
    }
}

/// Whether no process `pid` exists any more, not even as an unreaped zombie.
private func isGone(_ pid: Int32) -> Bool { kill(pid, 0) == -1 && errno == ESRCH }

/// The test credential helper (`Fixtures/token-helper.sh`) and the directory that steers it.
private struct Helper {
    /// One run of the helper, as it logged it.
    struct Call {
        var mode: String
        var pid: Int32
        var arguments: String
    }

    let script: String
    let directory: String

    init(in root: URL) throws {
        let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("Fixtures/token-helper.sh")
        let state = root.appendingPathComponent("helper")
        try FileManager.default.createDirectory(at: state, withIntermediateDirectories: true)
        // A copy with a known mode, whatever the checkout did to the executable bit.
        let copy = root.appendingPathComponent("token-helper.sh")
        try FileManager.default.copyItem(at: source, to: copy)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: copy.path)
        script = copy.path
        directory = state.path
    }

    func set(_ name: String, _ value: String) {
        _ = FileManager.default.createFile(atPath: directory + "/" + name, contents: Data((value + "\n").utf8))
    }

    /// Lines "N MODE PID ARGS...".
    var calls: [Call] {
        let text = (try? String(contentsOfFile: directory + "/calls", encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ", maxSplits: 3, omittingEmptySubsequences: false)
            guard fields.count >= 3, let pid = Int32(fields[2]) else { return nil }
            return Call(mode: String(fields[1]), pid: pid, arguments: fields.count > 3 ? String(fields[3]) : "")
        }
    }
}
