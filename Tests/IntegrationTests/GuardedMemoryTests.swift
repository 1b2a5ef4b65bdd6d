import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Where secrets live in a running brokerd (docs/security.md, "Secrets in memory"): its whole readable
/// memory, read as root through `/proc/PID/mem`, is searched for every refresh and access token
/// the test IdPs issued. A removed, rotated-away or logged-out token must be found nowhere, a
/// live one only inside guarded pages (locked, between two inaccessible pages, as
/// brokerd maps its `GuardedPages`); after `lock`, no token and no passphrase anywhere. Tokens
/// carry 40 random hex digits, so a hit cannot be a coincidence. Serialized: the scans read
/// hundreds of megabytes in blocking calls. Root only: brokerd is non-dumpable, so no other
/// process of its uid may read its memory.
@Suite(.serialized, .enabled(if: getuid() == 0)) struct GuardedMemoryTests {
    @Test func retiredTokensAreNowhereAndLiveOnesOnlyInGuardedPages() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        var idps: [String: OAuth2TestIdP] = [:]
        var initial: [String: String] = [:]
        for account in ["a", "b", "c", "d"] {
            initial[account] = "rt-\(account)-0-" + longRandomHex()
            let idp = try await OAuth2TestIdP(
                initialRefreshToken: initial[account]!, clientSecret: "cs-\(account)-" + longRandomHex())
            idp.issueLongTokens()
            idps[account] = idp
        }
        let pushed = "rt-b-pushed-" + longRandomHex()
        let (accounts, firstTokens, socketPath) = (idps, initial, broker.socketPath)
        // Blocking socket calls, off the cooperative threads the other suites' tasks need.
        let refused = try await onOwnThread {
            let connection = try RawConnection(path: socketPath)
            var refused: [String] = []
            let ask = { (op: String, line: String) in
                if !Self.succeeds(connection, line) { refused.append(op) }
            }
            for (account, idp) in accounts.sorted(by: { $0.key < $1.key }) {
                let provider =
                    #"{"kind":"oauth2","token_endpoint":"\#(idp.tokenEndpoint)","client_id":"\#(idp.clientID)","#
                    + #""client_secret":"\#(idp.clientSecret)","revocation_endpoint":"\#(idp.revocationEndpoint)"}"#
                let tokens = #"{"refresh_token":"\#(firstTokens[account]!)"}"#
                ask(
                    "add \(account)",
                    #"{"id":1,"op":"add","account":"\#(account)","provider":\#(provider),"tokens":\#(tokens)}"#)
            }
            for _ in 0..<3 { ask("refresh a", #"{"id":2,"op":"refresh","account":"a"}"#) }
            ask("refresh b", #"{"id":3,"op":"refresh","account":"b"}"#)
            accounts["b"]!.acceptRefreshToken(pushed)
            ask("set_tokens b", #"{"id":4,"op":"set_tokens","account":"b","tokens":{"refresh_token":"\#(pushed)"}}"#)
            ask("refresh b", #"{"id":5,"op":"refresh","account":"b"}"#)
            for account in ["c", "d"] {
                ask("refresh \(account)", #"{"id":6,"op":"refresh","account":"\#(account)"}"#)
            }
            ask("remove c", #"{"id":7,"op":"remove","account":"c"}"#)
            ask("logout d", #"{"id":8,"op":"logout","account":"d"}"#)
            for account in ["a", "b"] { ask("token \(account)", #"{"id":9,"op":"token","account":"\#(account)"}"#) }
            return refused
        }
        #expect(refused.isEmpty, "refused: \(refused)")
        #expect(idps["d"]!.revocations.count == 1, "the logout revoked at the IdP")
        initial["b-pushed"] = pushed
        try await onOwnThread { Self.letBrokerdFinish() }

        let live = ["a", "b"].compactMap { idps[$0]!.issuedRefreshTokens.last }
        let retired =
            Array(initial.values) + ["a", "b"].flatMap { idps[$0]!.issuedRefreshTokens.dropLast() }
            + ["c", "d"].flatMap { idps[$0]!.issuedRefreshTokens }
        // `add` of an oauth2 account with only a refresh token refreshes at once: 11 refreshes and
        // 14 retired tokens, or 10 when each account's first explicit refresh joins the one `add`
        // started (seen on a loaded machine).
        #expect(live.count == 2 && retired.count >= 10, "every refresh rotated the refresh token")
        let liveAccess = ["a", "b"].compactMap { idps[$0]!.issuedAccessTokens.last }
        let retiredAccess =
            ["a", "b"].flatMap { idps[$0]!.issuedAccessTokens.dropLast() }
            + ["c", "d"].flatMap { idps[$0]!.issuedAccessTokens }
        // Each refresh issues one access token with each refresh token, whatever the count of refreshes.
        #expect(
            liveAccess.count == 2 && retiredAccess.count == retired.count - initial.count,
            "every refresh issued an access token")
        let clientSecrets = idps.values.map(\.clientSecret)
        let pid = try #require(broker.process?.pid)
        let scan = try await onOwnThread {
            try MemoryScan(pid: pid, needles: live + retired + liveAccess + retiredAccess + clientSecrets)
        }
        #expect(scan.scannedBytes > 1 << 20, "the scan read the broker's memory")
        for token in retired + retiredAccess {
            #expect(scan.places(of: token).isEmpty, "a retired token in \(scan.places(of: token))")
        }
        for token in live + liveAccess {
            #expect(!scan.places(of: token).isEmpty, "the live token is in memory somewhere")
            #expect(scan.unguardedPlaces(of: token).isEmpty, "a live token in \(scan.unguardedPlaces(of: token))")
        }
        Self.report("live refresh tokens", live, scan)
        Self.report("retired refresh tokens", retired, scan)
        Self.report("live access tokens", liveAccess, scan)
        Self.report("retired access tokens", retiredAccess, scan)
        Self.report("client secrets", clientSecrets, scan)
        for idp in idps.values { await idp.shutdown() }
    }

    /// A static account added over the socket with a refresh token, on a broker that served
    /// other accounts and connections first, then given new tokens (`set_tokens`, its line sent
    /// in two parts, as a slow peer's arrives) and removed: none of its tokens is anywhere in
    /// brokerd's memory, not even in the read buffers of the connection that carried them,
    /// which is still open.
    @Test func aRemovedAccountsTokensAreNowhereNotEvenInTheRequestBytes() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let pid = try #require(broker.process?.pid)
        let others = (0..<8).map { "at-other-\($0)-" + longRandomHex() }
        let gone = [
            "rt-gone-0-" + longRandomHex(), "at-gone-0-" + longRandomHex(), "rt-gone-1-" + longRandomHex(),
            "at-gone-1-" + longRandomHex(),
        ]
        let socketPath = broker.socketPath
        // Blocking socket calls and the scan, off the cooperative threads; the connections stay
        // open through the scan.
        let (refused, scan) = try await onOwnThread {
            var refused: [String] = []
            let ask = { (connection: RawConnection, op: String, line: String) in
                if !Self.succeeds(connection, line) { refused.append(op) }
            }
            let first = try RawConnection(path: socketPath)
            for (index, token) in others.enumerated() {
                ask(
                    first, "add o\(index)",
                    #"{"id":1,"op":"add","account":"o\#(index)","provider":{"kind":"static"},"#
                        + #""tokens":{"access_token":"\#(token)","expires_in":3600}}"#)
            }
            for round in 0..<4 {
                let passing = try RawConnection(path: socketPath)
                for index in others.indices {
                    ask(passing, "token o\(index)", #"{"id":\#(round),"op":"token","account":"o\#(index)"}"#)
                }
                ask(passing, "status", #"{"id":2,"op":"status"}"#)
            }
            let carrier = try RawConnection(path: socketPath)
            ask(
                carrier, "add gone",
                #"{"id":3,"op":"add","account":"gone","provider":{"kind":"static"},"tokens":{"#
                    + #""refresh_token":"\#(gone[0])","access_token":"\#(gone[1])","expires_in":3600}}"#)
            ask(carrier, "token gone", #"{"id":4,"op":"token","account":"gone"}"#)
            let push =
                #"{"id":5,"op":"set_tokens","account":"gone","tokens":{"refresh_token":"\#(gone[2])","#
                + #""access_token":"\#(gone[3])","expires_in":3600}}"# + "\n"
            let half = push.utf8.count / 2
            _ = carrier.send(Array(push.utf8.prefix(half)))
            // brokerd reads the first half on its own, as a line not yet whole.
            Self.letBrokerdFinish()
            _ = carrier.send(Array(push.utf8.dropFirst(half)))
            if carrier.readObject()?["ok"] as? Bool != true { refused.append("set_tokens gone") }
            ask(carrier, "token gone", #"{"id":6,"op":"token","account":"gone"}"#)
            ask(carrier, "remove gone", #"{"id":7,"op":"remove","account":"gone"}"#)
            ask(first, "token o0", #"{"id":8,"op":"token","account":"o0"}"#)
            Self.letBrokerdFinish()
            let scan = try MemoryScan(pid: pid, needles: gone + others)
            withExtendedLifetime((first, carrier)) {}
            return (refused, scan)
        }
        #expect(refused.isEmpty, "refused: \(refused)")
        #expect(scan.scannedBytes > 1 << 20, "the scan read the broker's memory")
        for token in gone {
            #expect(scan.places(of: token).isEmpty, "a removed account's token in \(scan.places(of: token))")
        }
        for token in others {
            #expect(!scan.places(of: token).isEmpty, "a live token is in memory somewhere")
            #expect(scan.unguardedPlaces(of: token).isEmpty, "a live token in \(scan.unguardedPlaces(of: token))")
        }
        Self.report("removed account's tokens", gone, scan)
    }

    @Test func lockLeavesNoTokenAndNoPassphraseInMemory() async throws {
        let broker = try BrokerProcess()
        try await broker.start(arguments: ["--passphrase"])
        defer { broker.stop() }
        let passphrase = "pp-" + longRandomHex()
        let initial = "rt-0-" + longRandomHex()
        let idp = try await OAuth2TestIdP(initialRefreshToken: initial, clientSecret: "cs-" + longRandomHex())
        idp.issueLongTokens()
        let socketPath = broker.socketPath
        let provider =
            #"{"kind":"oauth2","token_endpoint":"\#(idp.tokenEndpoint)","client_id":"\#(idp.clientID)","#
            + #""client_secret":"\#(idp.clientSecret)"}"#
        let lines = [
            #"{"id":1,"op":"unlock","passphrase":"\#(passphrase)"}"#,
            #"{"id":2,"op":"add","account":"api","provider":\#(provider),"tokens":{"refresh_token":"\#(initial)"}}"#,
            #"{"id":3,"op":"refresh","account":"api"}"#, #"{"id":3,"op":"refresh","account":"api"}"#,
            #"{"id":4,"op":"token","account":"api"}"#, #"{"id":5,"op":"lock"}"#,
        ]
        // Blocking socket calls, off the cooperative threads the other suites' tasks need.
        let refused = try await onOwnThread {
            let connection = try RawConnection(path: socketPath)
            return lines.indices.filter { !Self.succeeds(connection, lines[$0]) }
        }
        #expect(refused.isEmpty, "refused: lines \(refused)")
        try await onOwnThread { Self.letBrokerdFinish() }

        let refreshTokens = [initial] + idp.issuedRefreshTokens
        let pid = try #require(broker.process?.pid)
        let scan = try await onOwnThread {
            try MemoryScan(
                pid: pid, needles: refreshTokens + idp.issuedAccessTokens + [passphrase, idp.clientSecret])
        }
        #expect(refreshTokens.count >= 3 && idp.issuedAccessTokens.count >= 2, "the refreshes rotated")
        for secret in refreshTokens + idp.issuedAccessTokens + [passphrase] {
            #expect(scan.places(of: secret).isEmpty, "a secret after lock in \(scan.places(of: secret))")
        }
        Self.report("refresh tokens after lock", refreshTokens, scan)
        Self.report("access tokens after lock", idp.issuedAccessTokens, scan)
        Self.report("the passphrase after lock", [passphrase], scan)
        Self.report("the client secret after lock", [idp.clientSecret], scan)
        await idp.shutdown()
    }

    /// The DPoP private key (docs/dpop.md), made by brokerd and read here from the stopped
    /// broker's vault: after a restart, refreshes with proofs and proofs for programs, it is in
    /// guarded pages only, as the vault's base64url text and as OpenSSL's signing key (its
    /// scalar's 64-bit limbs, least significant first: the raw bytes reversed, in the secure
    /// heap), and its raw big-endian 32 bytes (read from the vault) nowhere; a removed account's
    /// key is nowhere in any form; after a rekey to a passphrase and `lock`, no key is anywhere.
    @Test func aDPoPKeyIsOnlyInGuardedPagesAndNowhereAfterRemoveOrLock() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-0-" + longRandomHex())
        idp.requireDPoP(nonce: true)
        idp.issueLongTokens()
        let socketPath = broker.socketPath
        let provider =
            #"{"kind":"oauth2","token_endpoint":"\#(idp.tokenEndpoint)","client_id":"\#(idp.clientID)","dpop":"ES256"}"#
        let added = try await onOwnThread {
            let connection = try RawConnection(path: socketPath)
            return ["kept", "gone"].allSatisfy { account in
                Self.succeeds(
                    connection, #"{"id":1,"op":"add","account":"\#(account)","provider":\#(provider),"tokens":{}}"#)
            }
        }
        #expect(added)
        broker.stop()
        let keys = try broker.storedDPoPKeys()
        let (kept, gone) = (try #require(keys["kept"]), try #require(keys["gone"]))
        let raw = { (text: String) -> [UInt8] in
            var standard = text.replacing("-", with: "+").replacing("_", with: "/")
            while standard.count % 4 != 0 { standard += "=" }
            return Array(Data(base64Encoded: standard) ?? Data())
        }
        #expect(raw(kept).count == 32 && raw(gone).count == 32)

        try await broker.start()
        let pushed = "rt-p-" + longRandomHex()
        idp.acceptRefreshToken(pushed)
        let url = "https://api.example/v1/items"
        let refused = try await onOwnThread {
            let connection = try RawConnection(path: socketPath)
            var refused: [String] = []
            let lines = [
                #"{"id":2,"op":"set_tokens","account":"kept","tokens":{"refresh_token":"\#(pushed)"}}"#,
                #"{"id":3,"op":"refresh","account":"kept"}"#, #"{"id":4,"op":"refresh","account":"kept"}"#,
                #"{"id":5,"op":"token","account":"kept","dpop":{"htm":"GET","htu":"\#(url)"}}"#,
                #"{"id":6,"op":"token","account":"kept","dpop":{"htm":"POST","htu":"\#(url)","nonce":"n"}}"#,
                #"{"id":7,"op":"remove","account":"gone"}"#,
            ]
            for line in lines where !Self.succeeds(connection, line) { refused.append(line) }
            return refused
        }
        #expect(refused.isEmpty, "refused: \(refused)")
        #expect(idp.dpopProofsSeen >= 2, "the refreshes carried proofs")
        try await onOwnThread { Self.letBrokerdFinish() }
        let pid = try #require(broker.process?.pid)
        let needles = [
            ("kept", Array(kept.utf8)), ("gone", Array(gone.utf8)), ("kept raw", raw(kept)), ("gone raw", raw(gone)),
            ("kept limbs", raw(kept).reversed()), ("gone limbs", raw(gone).reversed()),
        ]
        let scan = try await onOwnThread { try MemoryScan(pid: pid, labeled: needles) }
        #expect(scan.scannedBytes > 1 << 20, "the scan read the broker's memory")
        for live in ["kept", "kept limbs"] {
            #expect(!scan.places(of: live).isEmpty, "\(live): the live key is in memory")
            #expect(scan.unguardedPlaces(of: live).isEmpty, "\(live) in \(scan.unguardedPlaces(of: live))")
        }
        for label in ["gone", "kept raw", "gone raw", "gone limbs"] {
            #expect(scan.places(of: label).isEmpty, "\(label) in \(scan.places(of: label))")
        }
        Self.report("live DPoP keys", ["kept", "kept limbs"], scan)

        let rekeyed = try await broker.brokerctl(["rekey", "--to", "passphrase"], stdin: "pp-dpop\n")
        #expect(rekeyed.status == 0, "\(rekeyed.stderr)")
        #expect(try await broker.brokerctl(["lock"]).status == 0)
        try await onOwnThread { Self.letBrokerdFinish() }
        let locked = try await onOwnThread { try MemoryScan(pid: pid, labeled: needles) }
        for (label, _) in needles {
            #expect(locked.places(of: label).isEmpty, "\(label) after lock in \(locked.places(of: label))")
        }
        Self.report("DPoP keys after lock", ["kept", "kept limbs"], locked)
        await idp.shutdown()
    }

    /// Sends `line` and tells whether the answer is a success.
    /// Waits on brokerd, on the caller's own thread, for what follows its last answers (the
    /// wipes of what they held, a read of what was sent) before its memory is looked at.
    static func letBrokerdFinish() {
        usleep(300_000)
    }

    static func succeeds(_ connection: RawConnection, _ line: String) -> Bool {
        guard connection.send(line + "\n"), let answer = connection.readObject() else { return false }
        return answer["ok"] as? Bool == true
    }

    /// Prints how many places hold the secrets of one kind and how many of those are guarded,
    /// never the secrets themselves.
    static func report(_ kind: String, _ secrets: [String], _ scan: MemoryScan) {
        let places = secrets.flatMap { scan.places(of: $0) }
        let unguarded = secrets.flatMap { scan.unguardedPlaces(of: $0) }
        print(
            "memory scan (\(scan.scannedBytes >> 20) MiB): \(secrets.count) \(kind) found in \(places.count) places, "
                + "\(places.count - unguarded.count) guarded; unguarded: \(unguarded.map(\.description))")
    }
}
