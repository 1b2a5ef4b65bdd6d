import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The secret-leak audit (docs/security.md, "What never leaks"): real brokerd processes
/// logging at `debug`, driven through
/// every op, every provider kind and every error path the test IdPs can provoke; then every
/// byte the broker and brokerctl said (the broker's log, every answer line, every event,
/// brokerctl's stdout and stderr) is searched for every refresh token, refresh URL and client
/// secret used, and access tokens are allowed only in `token` and `reject` answers and in
/// `brokerctl token`'s output. Serialized: the tests wait on sockets and processes in
/// blocking calls, and one at a time leaves the other cooperative threads to the other suites.
@Suite(.serialized) struct SecretAuditTests {
    /// What brokerd runs with here: debug logs, and IdP calls that give up after 2 s.
    static let environment = ["TOKENBROKER_LOG_LEVEL": "debug"]
    static let config = "[broker]\nrequest_timeout = 2\nbackoff_cap = 2\n"

    /// Every op of an `oauth2` account with a client secret and a revocation endpoint, through
    /// each IdP fault (5xx, garbage, hang, 401, invalid_grant), logout with and without
    /// revocation, bad requests that carry secrets, oversized lines, config reload errors, and
    /// the same through brokerctl.
    @Test func oauth2AccountsEveryOpAndEveryFault() async throws {
        let audit = SecretAudit()
        let refreshToken = audit.newSecret("rt")
        let idp = try await OAuth2TestIdP(initialRefreshToken: refreshToken, clientSecret: audit.newSecret("cs"))
        let broker = try BrokerProcess()
        try broker.writeConfig(Self.config)
        try await broker.start(environment: Self.environment)
        defer { broker.stop() }
        let events = try audit.subscribe(broker)
        let watch = try BackgroundBrokerctl(broker, ["watch", "--json"])
        let connection = try RawConnection(path: broker.socketPath, readTimeout: 30)
        let provider =
            #"{"kind":"oauth2","token_endpoint":"\#(idp.tokenEndpoint)","client_id":"\#(idp.clientID)","#
            + #""client_secret":"\#(idp.clientSecret)","revocation_endpoint":"\#(idp.revocationEndpoint)"}"#

        audit.ask(connection, #"{"id":1,"op":"hello","versions":[1],"client":"audit"}"#)
        let added = audit.ask(
            connection,
            #"{"id":2,"op":"add","account":"api","provider":\#(provider),"tokens":{"refresh_token":"\#(refreshToken)"}}"#
        )
        #expect(added?["ok"] as? Bool == true, "\(added ?? [:])")
        let served = try #require(audit.ask(connection, #"{"id":3,"op":"token","account":"api"}"#)?["result"])
        let accessToken = try #require((served as? [String: Any])?["access_token"] as? String)
        audit.ask(connection, #"{"id":4,"op":"reject","account":"api","access_token":"\#(accessToken)"}"#)
        audit.ask(connection, #"{"id":5,"op":"status"}"#)
        audit.ask(connection, #"{"id":6,"op":"refresh","account":"api"}"#)

        // Transient faults: the refresh fails, the token asked beyond what is cached too.
        let faults: [OAuth2TestIdP.Behavior] = [
            .status(500, retryAfter: 1), .status(503, retryAfter: nil), .garbage, .hang,
        ]
        for fault in faults {
            idp.setBehavior(fault)
            let refreshed = audit.ask(connection, #"{"id":7,"op":"refresh","account":"api"}"#)
            #expect(refreshed?.errorCode == "unavailable", "\(fault): \(refreshed ?? [:])")
            audit.ask(connection, #"{"id":8,"op":"token","account":"api","min_ttl":86400}"#)
            audit.ask(connection, #"{"id":9,"op":"status","account":"api"}"#)
        }
        // Denials: 401 invalid_client, then a refresh token the IdP does not know (400 invalid_grant).
        idp.setBehavior(.oauthError(401, error: "invalid_client", description: nil))
        #expect(audit.ask(connection, #"{"id":10,"op":"refresh","account":"api"}"#)?.errorCode == "needs_login")
        audit.ask(connection, #"{"id":11,"op":"token","account":"api"}"#)
        audit.ask(connection, #"{"id":12,"op":"status","account":"api"}"#)
        idp.setBehavior(.normal)
        let unknown = audit.newSecret("rt")
        audit.ask(connection, #"{"id":13,"op":"set_tokens","account":"api","tokens":{"refresh_token":"\#(unknown)"}}"#)
        #expect(audit.ask(connection, #"{"id":14,"op":"refresh","account":"api"}"#)?.errorCode == "needs_login")
        #expect(idp.rejectedReuse > 0, "the IdP refused the unknown refresh token")
        let current = try #require(idp.issuedRefreshTokens.last)
        audit.ask(connection, #"{"id":15,"op":"set_tokens","account":"api","tokens":{"refresh_token":"\#(current)"}}"#)
        #expect(audit.ask(connection, #"{"id":16,"op":"refresh","account":"api"}"#)?["ok"] as? Bool == true)

        // Logout: refused while the revocation endpoint fails, then revoked; an account without
        // a revocation endpoint is logged out by force.
        idp.setBehavior(.status(500, retryAfter: nil))
        #expect(audit.ask(connection, #"{"id":17,"op":"logout","account":"api"}"#)?["ok"] as? Bool == false)
        idp.setBehavior(.normal)
        #expect(audit.ask(connection, #"{"id":18,"op":"logout","account":"api"}"#)?["ok"] as? Bool == true)
        #expect(idp.revocations.contains { $0.token != nil }, "the logout revoked at the IdP")
        let plain =
            #"{"kind":"oauth2","token_endpoint":"\#(idp.tokenEndpoint)","client_id":"\#(idp.clientID)","#
            + #""client_secret":"\#(idp.clientSecret)","client_auth":"client_secret_basic"}"#
        audit.ask(
            connection,
            #"{"id":19,"op":"add","account":"plain","provider":\#(plain),"tokens":{"refresh_token":"\#(audit.newSecret("rt"))"}}"#
        )
        audit.ask(connection, #"{"id":20,"op":"logout","account":"plain","force":true}"#)
        for account in ["api", "plain", "api"] {
            audit.ask(connection, #"{"id":21,"op":"remove","account":"\#(account)"}"#)
        }

        audit.askBadRequests(connection, broker: broker)
        try await audit.reloadBrokenConfigs(broker, connection: connection)
        let cliToken = audit.newSecret("rt")
        let cliIdP = try await OAuth2TestIdP(initialRefreshToken: cliToken, clientSecret: audit.newSecret("cs"))
        try await audit.runBrokerctl(broker, idp: cliIdP, refreshToken: cliToken)

        audit.drain(events, source: "subscription")
        watch.child.stop()
        audit.record("brokerctl watch stdout", watch.stdout)
        audit.record("brokerctl watch stderr", watch.stderr)
        #expect(watch.stdout.contains("\"refreshed\""), "the watch saw the events")
        broker.stop()
        audit.record("brokerd log", broker.log)
        #expect(broker.log.contains("request failed"), "the log is at debug level")
        audit.addSecrets(idp.issuedRefreshTokens + cliIdP.issuedRefreshTokens)
        #expect(
            audit.heard(accessToken) && audit.heard(#""event":"needs_login""#), "the audit captured answers and events")
        #expect(audit.leaks(accessTokens: idp.issuedAccessTokens + cliIdP.issuedAccessTokens) == [])
        await idp.shutdown()
        await cliIdP.shutdown()
    }

    /// `refresh_url`, `sliding`, `exec`, `file` and `static` accounts through every op and
    /// each fault their source can show (5xx, garbage, hang, denial; a helper that fails, is
    /// denied or prints half its JSON; a torn token file), directly and through brokerctl.
    @Test func everyOtherKindEveryOpAndEveryFault() async throws {
        let audit = SecretAudit()
        let urlIdP = try await RefreshURLTestIdP()
        let slidingToken = audit.newSecret("srt")
        let slidingIdP = try await SlidingTestIdP(initialRefreshToken: slidingToken)
        let broker = try BrokerProcess()
        try broker.writeConfig(Self.config)
        let helper = try ExecHelper(in: broker.root, secret: audit.newSecret("exec"))
        let tokenFile = broker.root.appendingPathComponent("home/token.json").path
        let fileSecret = audit.newSecret("file")
        let fileToken = "file-at-\(UInt64.random(in: 0...UInt64.max))"
        try Self.writeTokenFile(
            #"{"access_token":"\#(fileToken)","expires_in":3600,"refresh_token":"\#(fileSecret)"}"#, to: tokenFile)
        try await broker.start(environment: Self.environment)
        defer { broker.stop() }
        let events = try audit.subscribe(broker)
        let connection = try RawConnection(path: broker.socketPath, readTimeout: 30)
        audit.addSecrets([Self.marker(of: urlIdP.initialURL)])

        let urlAccount = AuditedAccount(
            name: "url", provider: #"{"kind":"refresh_url","method":"POST"}"#,
            tokens: #"{"refresh_url":"\#(urlIdP.initialURL)"}"#, setBehavior: urlIdP.setBehavior,
            deny: { urlIdP.revoke() }, recover: { #"{"refresh_url":"\#(urlIdP.reissue())"}"# })
        let stale = audit.newSecret("srt")
        let slidingAccount = AuditedAccount(
            name: "sliding", provider: #"{"kind":"sliding","endpoint":"\#(slidingIdP.endpoint)"}"#,
            tokens: #"{"refresh_token":"\#(slidingToken)"}"#, setBehavior: slidingIdP.setBehavior,
            deny: {}, denyingTokens: #"{"refresh_token":"\#(stale)"}"#,
            recover: { #"{"refresh_token":"\#(slidingIdP.issuedRefreshTokens.last ?? "")"}"# })
        for account in [urlAccount, slidingAccount] {
            try await audit.exercise(account, connection: connection, broker: broker)
        }

        // exec: a helper that traces itself onto stderr, then fails, is denied, prints half.
        let exec = #"{"kind":"exec","command":["\#(helper.script)","\#(helper.directory)"]}"#
        audit.ask(connection, #"{"id":60,"op":"add","account":"exec","provider":\#(exec)}"#)
        audit.ask(connection, #"{"id":61,"op":"token","account":"exec"}"#)
        for mode in ["fail", "torn", "hang", "deny", "ok"] {
            helper.set(mode: mode)
            audit.ask(connection, #"{"id":62,"op":"refresh","account":"exec"}"#)
            audit.ask(connection, #"{"id":63,"op":"status","account":"exec"}"#)
            audit.ask(connection, #"{"id":64,"op":"token","account":"exec","min_ttl":86400}"#)
        }
        try await audit.brokerctl(broker, ["status", "exec", "--json"])
        try await audit.brokerctl(broker, ["token", "exec"])

        // file: a token file that also holds a refresh token, then one torn in half.
        audit.ask(
            connection, #"{"id":70,"op":"add","account":"file","provider":{"kind":"file","path":"\#(tokenFile)"}}"#)
        #expect(audit.ask(connection, #"{"id":71,"op":"token","account":"file"}"#)?["ok"] as? Bool == true)
        try Self.writeTokenFile(#"{"access_token":"\#(fileToken)","refresh_token":"\#(fileSecret)""#, to: tokenFile)
        audit.ask(connection, #"{"id":72,"op":"refresh","account":"file"}"#)
        audit.ask(connection, #"{"id":73,"op":"status","account":"file"}"#)
        try await audit.brokerctl(broker, ["status", "file"])

        // static: pushed tokens only.
        let staticToken = "static-at-\(UInt64.random(in: 0...UInt64.max))"
        let staticTokens = #"{"access_token":"\#(staticToken)","expires_in":3600}"#
        audit.ask(
            connection,
            #"{"id":80,"op":"add","account":"static","provider":{"kind":"static"},"tokens":\#(staticTokens)}"#)
        audit.ask(connection, #"{"id":81,"op":"refresh","account":"static"}"#)
        audit.ask(connection, #"{"id":82,"op":"set_tokens","account":"static","tokens":\#(staticTokens)}"#)
        audit.ask(connection, #"{"id":83,"op":"token","account":"static"}"#)
        audit.ask(connection, #"{"id":84,"op":"token","account":"static","min_ttl":86400}"#)
        try await audit.brokerctl(broker, ["token", "static"])
        try await audit.brokerctl(broker, ["status"])
        try await audit.brokerctl(broker, ["status", "--json"])
        for account in ["exec", "file", "static"] {
            audit.ask(connection, #"{"id":85,"op":"logout","account":"\#(account)","force":true}"#)
            audit.ask(connection, #"{"id":86,"op":"remove","account":"\#(account)"}"#)
        }

        audit.drain(events, source: "subscription")
        broker.stop()
        audit.record("brokerd log", broker.log)
        audit.addSecrets(urlIdP.issuedURLs.map(Self.marker) + slidingIdP.issuedRefreshTokens)
        let accessTokens =
            urlIdP.issuedAccessTokens + slidingIdP.issuedAccessTokens + helper.issuedAccessTokens + [
                fileToken, staticToken,
            ]
        #expect(helper.issuedAccessTokens.count >= 2, "the helper ran")
        #expect(audit.heard(fileToken) && audit.heard(staticToken), "the audit captured the token answers")
        #expect(audit.leaks(accessTokens: accessTokens) == [])
        await urlIdP.shutdown()
        await slidingIdP.shutdown()
    }

    /// `brokerctl login` with a client secret the broker reads from stdin: approved, denied,
    /// expired and cancelled (SIGINT) device logins, then the account used and logged out.
    @Test func loginsApprovedDeniedExpiredAndCancelled() async throws {
        let audit = SecretAudit()
        let idp = try await OAuth2TestIdP(clientSecret: audit.newSecret("cs"))
        idp.setDeviceTiming(interval: 1)
        let broker = try BrokerProcess()
        try broker.writeConfig(Self.config)
        try await broker.start(environment: Self.environment)
        defer { broker.stop() }
        let events = try audit.subscribe(broker)
        let provider = ["--issuer", idp.issuer, "--client-id", idp.clientID, "--scope", "openid offline_access"]
        let secrets = #"{"client_secret":"\#(idp.clientSecret)"}"#
        func login(_ account: String, json: Bool = false) throws -> BackgroundBrokerctl {
            try BackgroundBrokerctl(
                broker, ["login", account, "--flow", "device", "--secrets", "-"] + (json ? ["--json"] : []) + provider,
                stdin: secrets)
        }
        func finish(_ login: BackgroundBrokerctl, _ name: String) async -> Int32 {
            let status = await login.finish()
            audit.record("brokerctl login \(name) stdout", login.stdout)
            audit.record("brokerctl login \(name) stderr", login.stderr)
            return status
        }

        let approved = try login("work")
        #expect(try await idp.decide(.approve, at: try await approved.deviceLink()) == 200)
        #expect(await finish(approved, "approved") == 0)
        let denied = try login("denied", json: true)
        let code = try await denied.jsonEvent("device_code")
        #expect(try await idp.decide(.deny, at: try #require(code["verification_uri_complete"] as? String)) == 200)
        #expect(await finish(denied, "denied") == 5)
        let expired = try login("expired")
        _ = try await expired.deviceLink()
        idp.expireDeviceCodes()
        #expect(await finish(expired, "expired") == 5)
        let cancelled = try login("cancelled")
        _ = try await cancelled.deviceLink()
        kill(cancelled.child.pid, SIGINT)
        #expect(await finish(cancelled, "cancelled") == 130)
        idp.setBehavior(.status(500, retryAfter: nil))
        let unavailable = try login("unavailable")
        #expect(await finish(unavailable, "unavailable") != 0)
        idp.setBehavior(.normal)
        // An issuer whose discovery document is garbage: the login fails before any code.
        let broken = try await OAuth2TestIdP(clientSecret: audit.newSecret("cs"))
        broken.setDiscoveryBehavior(.garbage)
        let undiscovered = try BackgroundBrokerctl(
            broker,
            [
                "login", "undiscovered", "--flow", "device", "--secrets", "-", "--issuer", broken.issuer, "--client-id",
                broken.clientID,
            ],
            stdin: #"{"client_secret":"\#(broken.clientSecret)"}"#)
        #expect(await finish(undiscovered, "undiscovered") == 6)
        await broken.shutdown()

        try await audit.brokerctl(broker, ["token", "work"])
        try await audit.brokerctl(broker, ["token", "work", "--id-token"])
        try await audit.brokerctl(broker, ["refresh", "work"])
        try await audit.brokerctl(broker, ["status", "--json"])
        #expect(try await audit.brokerctl(broker, ["logout", "work"]).status == 0)
        try await audit.brokerctl(broker, ["status", "work"])
        try await audit.brokerctl(broker, ["remove", "work"])

        audit.drain(events, source: "subscription")
        broker.stop()
        audit.record("brokerd log", broker.log)
        audit.addSecrets(idp.issuedRefreshTokens)
        #expect(audit.heard("logged in work"), "the audit captured brokerctl login's output")
        #expect(audit.leaks(accessTokens: idp.issuedAccessTokens) == [])
        await idp.shutdown()
    }

    /// Passphrase mode: the first unlock setting the passphrase, wrong passphrases through
    /// brokerctl and on the wire, lock, unlock, a rekey to a new passphrase and one to the key
    /// file, and passphrases in requests that have no use for them; no passphrase in anything
    /// brokerd or brokerctl says.
    @Test func passphrasesInUnlockLockAndRekey() async throws {
        let audit = SecretAudit()
        let first = audit.newPassphrase()
        let second = audit.newPassphrase()
        let wrong = audit.newPassphrase()
        let broker = try BrokerProcess()
        try broker.writeConfig(Self.config)
        try await broker.start(arguments: ["--passphrase"], environment: Self.environment)
        defer { broker.stop() }
        let connection = try RawConnection(path: broker.socketPath, readTimeout: 30)
        audit.ask(connection, #"{"id":1,"op":"status"}"#)
        #expect(try await audit.brokerctl(broker, ["unlock"], stdin: first + "\n").status == 0)
        let events = try audit.subscribe(broker)
        let added = audit.ask(
            connection,
            #"{"id":2,"op":"add","account":"api","provider":{"kind":"static"},"#
                + #""tokens":{"access_token":"at-audit","expires_in":3600}}"#)
        #expect(added?["ok"] as? Bool == true, "\(added ?? [:])")
        #expect(try await audit.brokerctl(broker, ["lock"]).status == 0)
        audit.ask(connection, #"{"id":3,"op":"token","account":"api"}"#)
        #expect(try await audit.brokerctl(broker, ["unlock"], stdin: wrong + "\n").status == 7)
        #expect(audit.ask(connection, #"{"id":4,"op":"unlock","passphrase":"\#(wrong)"}"#)?.errorCode == "forbidden")
        #expect(try await audit.brokerctl(broker, ["unlock"], stdin: first + "\n").status == 0)
        audit.ask(connection, #"{"id":5,"op":"unlock","passphrase":"\#(wrong)"}"#)
        audit.ask(connection, #"{"id":6,"op":"rekey","to":"\#(wrong)","passphrase":"\#(wrong)"}"#)
        audit.ask(connection, #"{"id":7,"op":"lock","passphrase":"\#(wrong)","account":"\#(wrong)"}"#)
        #expect(try await audit.brokerctl(broker, ["unlock"], stdin: first + "\n").status == 0)
        let rekeyed = try await audit.brokerctl(broker, ["rekey"], stdin: second + "\n")
        #expect(rekeyed.status == 0, "\(rekeyed.stderr)")
        #expect(try await audit.brokerctl(broker, ["lock"]).status == 0)
        #expect(try await audit.brokerctl(broker, ["unlock"], stdin: second + "\n").status == 0)
        try await audit.brokerctl(broker, ["token", "api"])
        #expect(try await audit.brokerctl(broker, ["rekey", "--to", "keyfile"]).status == 0)
        try await audit.brokerctl(broker, ["status"])

        audit.drain(events, source: "subscription")
        broker.stop()
        audit.record("brokerd log", broker.log)
        #expect(audit.heard("unlocked"), "the audit captured the unlocks")
        #expect(audit.leaks(accessTokens: ["at-audit"]) == [])
    }

    /// The secret part of a refresh URL (what follows `/refresh/`).
    static func marker(of url: String) -> String {
        url.components(separatedBy: "/refresh/").last ?? url
    }

    /// Writes a token file as its keeper would: a new file renamed over the old one.
    static func writeTokenFile(_ text: String, to path: String) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path + ".new"))
        chmod(path + ".new", 0o600)
        #expect(rename(path + ".new", path) == 0)
    }
}

/// An account of an IdP-backed kind and how the test makes its IdP fail, deny and recover.
struct AuditedAccount {
    var name: String
    /// The `provider` and `tokens` objects of its `add`.
    var provider: String
    var tokens: String
    var setBehavior: (OAuth2TestIdP.Behavior) -> Void
    /// Makes the IdP deny the current credential.
    var deny: () -> Void
    /// Tokens pushed before the denial (credentials the IdP does not know), if any.
    var denyingTokens: String?
    /// Tokens that work again (a new login).
    var recover: () -> String
}

/// A credential helper for `exec` accounts that prints a refresh token beside its access
/// token and traces what it prints onto stderr, as a shell script run with `set -x` would.
struct ExecHelper {
    let script: String
    let directory: String

    init(in root: URL, secret: String) throws {
        directory = root.appendingPathComponent("exec-helper").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        script = root.appendingPathComponent("exec-helper.sh").path
        let text = """
            #!/bin/sh
            mode=$(cat "$1/mode" 2>/dev/null || echo ok)
            at="exec-at-$$-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
            echo "$at" >> "$1/issued"
            case "$mode" in
            ok)
                echo "+ printf {\"access_token\":\"$at\",\"refresh_token\":\"\(secret)\"}" >&2
                printf '{"access_token":"%s","expires_in":3600,"refresh_token":"%s"}\n' "$at" "\(secret)" ;;
            torn) printf '{"access_token":"%s","refresh_token":"%s"' "$at" "\(secret)" ;;
            deny) printf '{"error":"invalid_grant","refresh_token":"%s"}\n' "\(secret)"; exit 1 ;;
            hang) exec sleep 30 ;;
            *) echo "helper: backend unreachable" >&2; exit 1 ;;
            esac

            """
        try Data(text.utf8).write(to: URL(fileURLWithPath: script))
        chmod(script, 0o700)
    }

    func set(mode: String) {
        _ = FileManager.default.createFile(atPath: directory + "/mode", contents: Data((mode + "\n").utf8))
    }

    /// Every access token the helper printed (or tried to).
    var issuedAccessTokens: [String] {
        ((try? String(contentsOfFile: directory + "/issued", encoding: .utf8)) ?? "").split(separator: "\n").map(
            String.init)
    }
}

/// Every secret a test gave a broker, and everything the broker and brokerctl said.
final class SecretAudit {
    /// Refresh tokens, refresh URLs (or their secret parts) and client secrets.
    private(set) var secrets: [String] = []
    /// What was said, and whether it may hold an access token.
    private var said: [(source: String, text: String, mayHoldAccessTokens: Bool)] = []

    /// A new secret to give the broker, unique and easy to find: `KIND-AUDIT-<random>`.
    func newSecret(_ kind: String) -> String {
        let secret = "\(kind)-AUDIT-\(UInt64.random(in: 0...UInt64.max))"
        secrets.append(secret)
        return secret
    }

    /// Secrets the test did not make (an IdP's rotated refresh tokens and URLs).
    func addSecrets(_ more: [String]) { secrets += more }

    /// The passphrases used (`newPassphrase`), searched for like every other secret.
    private(set) var passphrases: [String] = []

    /// A new passphrase to type, unique and easy to find: `pass-AUDIT-<random> words`.
    func newPassphrase() -> String {
        let passphrase = "pass-AUDIT-\(UInt64.random(in: 0...UInt64.max)) horse battery"
        passphrases.append(passphrase)
        return passphrase
    }

    /// Whether anything recorded holds `text` (the audit's check on itself: it did capture).
    func heard(_ text: String) -> Bool { said.contains { $0.text.contains(text) } }

    /// Notes what `source` said.
    func record(_ source: String, _ text: String, mayHoldAccessTokens: Bool = false) {
        said.append((source, text, mayHoldAccessTokens))
    }

    /// Sends `line` on `connection` and records the answer; only a successful `token` or
    /// `reject` answer may hold an access token.
    @discardableResult
    func ask(_ connection: RawConnection, _ line: String) -> [String: Any]? {
        let op = (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["op"] as? String
        guard let answer = connection.request(line) else {
            record("no answer to \(op ?? "?")", "")
            return nil
        }
        let object = (try? JSONSerialization.jsonObject(with: Data(answer.utf8))) as? [String: Any]
        let handsOutToken = (op == "token" || op == "reject") && object?["ok"] as? Bool == true
        record("answer to \(op ?? "a bad line")", answer, mayHoldAccessTokens: handsOutToken)
        return object
    }

    /// A `subscribe` connection to `broker` (all accounts), its acknowledgement recorded.
    func subscribe(_ broker: BrokerProcess) throws -> RawConnection {
        let connection = try RawConnection(path: broker.socketPath, readTimeout: 30)
        ask(connection, #"{"id":"events","op":"subscribe"}"#)
        return connection
    }

    /// Records every line `connection` has received until it stays quiet for a second.
    func drain(_ connection: RawConnection, source: String) {
        while connection.hasData(within: 1), let line = connection.readLine() {
            record(source, String(decoding: line, as: UTF8.self))
        }
    }

    /// Runs brokerctl against `broker` and records what it printed; only `token`'s stdout
    /// may hold an access token.
    @discardableResult
    func brokerctl(_ broker: BrokerProcess, _ arguments: [String], stdin: String? = nil) async throws -> (
        status: Int32, stdout: String, stderr: String
    ) {
        let result = try await broker.brokerctl(arguments, stdin: stdin)
        let command = "brokerctl " + arguments.prefix(2).joined(separator: " ")
        record(command + " stdout", result.stdout, mayHoldAccessTokens: arguments.first == "token")
        record(command + " stderr", result.stderr)
        return result
    }

    /// Every op on `account`: add, token, reject, status, refresh through each transient
    /// fault, a denial, new tokens, logout (nothing to revoke, so forced too) and remove, and
    /// brokerctl's `status` and `token` between them.
    func exercise(_ account: AuditedAccount, connection: RawConnection, broker: BrokerProcess) async throws {
        let name = account.name
        let added = ask(
            connection,
            #"{"id":1,"op":"add","account":"\#(name)","provider":\#(account.provider),"tokens":\#(account.tokens)}"#)
        #expect(added?["ok"] as? Bool == true, "\(name): \(added ?? [:])")
        let token =
            (ask(connection, #"{"id":2,"op":"token","account":"\#(name)"}"#)?["result"] as? [String: Any])?[
                "access_token"] as? String
        ask(connection, #"{"id":3,"op":"reject","account":"\#(name)","access_token":"\#(token ?? "")"}"#)
        try await brokerctl(broker, ["token", name])
        let faults: [OAuth2TestIdP.Behavior] = [.status(500, retryAfter: 1), .garbage, .hang]
        for fault in faults {
            account.setBehavior(fault)
            #expect(ask(connection, #"{"id":4,"op":"refresh","account":"\#(name)"}"#)?.errorCode == "unavailable")
            ask(connection, #"{"id":5,"op":"token","account":"\#(name)","min_ttl":86400}"#)
            ask(connection, #"{"id":6,"op":"status","account":"\#(name)"}"#)
        }
        account.setBehavior(.normal)
        account.deny()
        if let tokens = account.denyingTokens {
            ask(connection, #"{"id":7,"op":"set_tokens","account":"\#(name)","tokens":\#(tokens)}"#)
        }
        #expect(ask(connection, #"{"id":8,"op":"refresh","account":"\#(name)"}"#)?.errorCode == "needs_login")
        ask(connection, #"{"id":9,"op":"token","account":"\#(name)"}"#)
        try await brokerctl(broker, ["status", name])
        try await brokerctl(broker, ["status", name, "--json"])
        try await brokerctl(broker, ["token", name])
        ask(connection, #"{"id":10,"op":"set_tokens","account":"\#(name)","tokens":\#(account.recover())}"#)
        #expect(ask(connection, #"{"id":11,"op":"refresh","account":"\#(name)"}"#)?["ok"] as? Bool == true, "\(name)")
        account.setBehavior(.status(500, retryAfter: nil))
        ask(connection, #"{"id":12,"op":"logout","account":"\#(name)"}"#)
        account.setBehavior(.normal)
        ask(connection, #"{"id":13,"op":"logout","account":"\#(name)","force":true}"#)
        ask(connection, #"{"id":14,"op":"remove","account":"\#(name)"}"#)
    }

    /// Requests that carry secrets in the fields a client gets wrong: each is refused, and
    /// no refusal repeats the secret. Then lines over 64 KiB, and lines that are not JSON.
    func askBadRequests(_ connection: RawConnection, broker: BrokerProcess) {
        let token = newSecret("rt")
        let clientSecret = newSecret("cs")
        let urlMarker = newSecret("url")
        let lines = [
            #"{"id":30,"op":"add","account":"bad30","provider":{"kind":"nope","client_secret":"\#(clientSecret)"},"tokens":{"refresh_token":"\#(token)"}}"#,
            #"{"id":33,"op":"add","account":"bad33","provider":{"kind":"oauth2","token_endpoint":"https://idp.example/token","client_id":"c","client_secret":42},"tokens":{"refresh_token":"\#(token)"}}"#,
            #"{"id":34,"op":"add","account":"bad34","provider":{"kind":"oauth2","token_endpoint":"https://idp.example/token","client_id":"c","client_secret":"\#(clientSecret)","client_auth":"bogus"}}"#,
            #"{"id":35,"op":"add","account":"bad35","provider":{"kind":"static"},"tokens":{"refresh_token":"\#(token)","expires_in":"soon"}}"#,
            #"{"id":36,"op":"add","account":"bad36","provider":{"kind":"static"},"tokens":{"refresh_token":["\#(token)"]}}"#,
            #"{"id":38,"op":"set_tokens","account":"missing","tokens":{"refresh_token":"\#(token)"}}"#,
            #"{"id":39,"op":"add","account":"bad!name","provider":{"kind":"static"},"tokens":{"refresh_token":"\#(token)"}}"#,
            #"{"id":40,"op":"add","account":"bad40","tokens":{"refresh_token":"\#(token)","refresh_token":"\#(token)"}}"#,
            #"{"id":41,"op":"add","account":"bad41","tokens":{"refresh_token":"\#(token)"}"#,
            #"{"id":42,"op":"reject","account":"missing","access_token":"\#(token)"}"#,
            #"{"id":43,"op":"add","account":"bad43","provider":{"kind":"oauth2","token_endpoint":"http://idp.example/\#(urlMarker)","client_id":"c"}}"#,
        ]
        for line in lines {
            let answer = ask(connection, line)
            #expect(answer?["ok"] as? Bool == false, "\(line) was refused")
        }
        // Credentials the broker takes and finds unusable only when it refreshes: a refresh URL
        // over plain http or not a URL at all, a refresh URL given to a sliding account.
        let taken = [
            (#"{"kind":"refresh_url"}"#, #"{"refresh_url":"http://idp.example/refresh/\#(urlMarker)"}"#),
            (#"{"kind":"refresh_url"}"#, #"{"refresh_url":"not a URL \#(urlMarker)"}"#),
            (
                #"{"kind":"sliding","endpoint":"https://idp.example/r"}"#,
                #"{"refresh_url":"https://idp.example/\#(urlMarker)"}"#
            ),
        ]
        for (provider, tokens) in taken {
            ask(connection, #"{"id":31,"op":"add","account":"taken","provider":\#(provider),"tokens":\#(tokens)}"#)
            #expect(
                ask(connection, #"{"id":32,"op":"refresh","account":"taken"}"#)?["ok"] as? Bool == false, "\(tokens)")
            ask(connection, #"{"id":33,"op":"status","account":"taken"}"#)
            ask(connection, #"{"id":34,"op":"remove","account":"taken"}"#)
        }
        // Too long: refused, the connection closed; the broker keeps serving others.
        for filler in [String(repeating: "x", count: 70_000), String(repeating: " ", count: 70_000)] {
            guard let long = try? RawConnection(path: broker.socketPath) else { continue }
            let line =
                #"{"id":44,"op":"set_tokens","account":"api","tokens":{"refresh_token":"\#(token)"},"#
                + #""pad":"\#(filler)"}"#
            ask(long, line)
            drain(long, source: "oversized line connection")
        }
    }

    /// Config files a person got wrong, holding secrets where none belongs: each reload is
    /// refused (by `reload` and by SIGHUP) without repeating them.
    func reloadBrokenConfigs(_ broker: BrokerProcess, connection: RawConnection) async throws {
        let configs = [
            "[accounts.declared]\nkind = \"oauth2\"\ntoken_endpoint = \"https://idp.example/token\"\n"
                + "client_id = \"c\"\nclient_secret = \"\(newSecret("cs"))\"\n",
            "[accounts.declared]\nkind = \"static\"\nrefresh_token = \"\(newSecret("rt"))\"\n",
            "[accounts.declared]\nkind = \"refresh_url\"\nrefresh_url = \"https://idp.example/\(newSecret("url"))\"\n",
            "[accounts.declared]\nkind = \"static\"\nrefresh_token = \"\(newSecret("rt"))\" trailing\n",
            "[accounts.declared]\nkind = \"oauth2\"\ntoken_endpoint = \"\(newSecret("rt"))\n",
            "[broker]\nrequest_timeout = \"\(newSecret("cs"))\"\n",
        ]
        for config in configs {
            try broker.writeConfig(config)
            #expect(ask(connection, #"{"id":50,"op":"reload"}"#)?["ok"] as? Bool == false, "\(config)")
            // brokerd logs its refusal of the reload SIGHUP asks for.
            let refusals = broker.log.components(separatedBy: "config not reloaded").count
            broker.signal(SIGHUP)
            #expect(await eventually { broker.log.components(separatedBy: "config not reloaded").count > refusals })
        }
        try broker.writeConfig(SecretAuditTests.config)
        #expect(ask(connection, #"{"id":51,"op":"reload"}"#)?["ok"] as? Bool == true)
    }

    /// The owner's commands of brokerctl on an `oauth2` account at `idp`, their errors too
    /// (no broker account, secrets input that is not JSON, an IdP that fails).
    func runBrokerctl(_ broker: BrokerProcess, idp: OAuth2TestIdP, refreshToken: String) async throws {
        let provider = [
            "--token-endpoint", idp.tokenEndpoint, "--client-id", idp.clientID, "--revocation-endpoint",
            idp.revocationEndpoint,
        ]
        let secrets = #"{"refresh_token":"\#(refreshToken)","client_secret":"\#(idp.clientSecret)"}"#
        let added = try await brokerctl(
            broker, ["add", "cli", "--kind", "oauth2", "--secrets", "-"] + provider, stdin: secrets)
        #expect(added.status == 0, "\(added.stderr)")
        #expect(try await brokerctl(broker, ["token", "cli"]).status == 0)
        for arguments in [["status"], ["status", "--json"], ["status", "cli", "--json"], ["refresh", "cli"]] {
            try await brokerctl(broker, arguments)
        }
        idp.setBehavior(.status(502, retryAfter: nil))
        #expect(try await brokerctl(broker, ["refresh", "cli"]).status != 0)
        try await brokerctl(broker, ["token", "cli", "--min-ttl", "86400"])
        try await brokerctl(broker, ["logout", "cli"])
        idp.setBehavior(.normal)
        let torn = #"{"refresh_token":"\#(newSecret("rt"))","client_secret":"\#(newSecret("cs"))""#
        #expect(
            try await brokerctl(broker, ["add", "torn", "--kind", "oauth2", "--secrets", "-"] + provider, stdin: torn)
                .status != 0)
        #expect(try await brokerctl(broker, ["set-tokens", "cli"], stdin: torn).status != 0)
        let stray = #"{"refresh_token":"\#(newSecret("rt"))"}"#
        #expect(try await brokerctl(broker, ["set-tokens", "missing"], stdin: stray).status != 0)
        #expect(try await brokerctl(broker, ["set-tokens", "cli"], stdin: stray).status == 0)
        #expect(try await brokerctl(broker, ["refresh", "cli"]).status != 0, "the IdP denies the stray token")
        try await brokerctl(broker, ["status", "cli"])
        try await brokerctl(broker, ["logout", "cli", "--force"])
        try await brokerctl(broker, ["reload"])
        try await brokerctl(broker, ["remove", "cli"])
        try await brokerctl(broker, ["remove", "cli"])
    }

    /// Each place where a secret (or, outside token answers, an access token) was found.
    func leaks(accessTokens: [String]) -> [String] {
        var found: [String] = []
        for (source, text, mayHoldAccessTokens) in said {
            for secret in secrets + passphrases where text.contains(secret) {
                found.append("\(source) holds the secret \(Self.label(secret)): \(excerpt(text, around: secret))")
            }
            guard !mayHoldAccessTokens else { continue }
            for token in accessTokens where text.contains(token) {
                found.append("\(source) holds an access token: \(excerpt(text, around: token))")
            }
        }
        return found
    }

    /// A secret's kind without its value (test output must not repeat it either).
    private static func label(_ secret: String) -> String {
        String(secret.prefix { $0 != "-" }) + "-…"
    }

    /// The text around `needle`, with every secret in it replaced.
    private func excerpt(_ text: String, around needle: String) -> String {
        guard let range = text.range(of: needle) else { return "" }
        var excerpt = "\(text[..<range.lowerBound].suffix(160))<FOUND>\(text[range.upperBound...].prefix(80))"
        for secret in secrets + passphrases { excerpt = excerpt.replacingOccurrences(of: secret, with: "<SECRET>") }
        return excerpt
    }
}
