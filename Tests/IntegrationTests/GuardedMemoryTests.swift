import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Where secrets live in a running brokerd (issue 11, floor items 2 and 3): its whole readable
/// memory, read as root through `/proc/PID/mem`, is searched for every refresh token the test
/// IdPs issued. A removed, rotated-away or logged-out refresh token must be found nowhere, a
/// live one only inside guarded pages (locked, between two inaccessible pages, as
/// `sodium_malloc` makes them); after `lock`, no token and no passphrase anywhere. Tokens
/// carry 40 random hex digits, so a hit cannot be a coincidence. Serialized: the scans read
/// hundreds of megabytes in blocking calls. Root only: brokerd is non-dumpable, so no other
/// process of its uid may read its memory.
@Suite(.serialized, .enabled(if: getuid() == 0)) struct GuardedMemoryTests {
    @Test func retiredRefreshTokensAreNowhereAndLiveOnesOnlyInGuardedPages() async throws {
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
        do {
            let connection = try RawConnection(path: broker.socketPath)
            for (account, idp) in idps.sorted(by: { $0.key < $1.key }) {
                let provider =
                    #"{"kind":"oauth2","token_endpoint":"\#(idp.tokenEndpoint)","client_id":"\#(idp.clientID)","#
                    + #""client_secret":"\#(idp.clientSecret)","revocation_endpoint":"\#(idp.revocationEndpoint)"}"#
                let tokens = #"{"refresh_token":"\#(initial[account]!)"}"#
                #expect(
                    Self.succeeds(
                        connection,
                        #"{"id":1,"op":"add","account":"\#(account)","provider":\#(provider),"tokens":\#(tokens)}"#
                    ))
            }
            for _ in 0..<3 { #expect(Self.succeeds(connection, #"{"id":2,"op":"refresh","account":"a"}"#)) }
            #expect(Self.succeeds(connection, #"{"id":3,"op":"refresh","account":"b"}"#))
            let pushed = "rt-b-pushed-" + longRandomHex()
            idps["b"]!.acceptRefreshToken(pushed)
            #expect(
                Self.succeeds(
                    connection, #"{"id":4,"op":"set_tokens","account":"b","tokens":{"refresh_token":"\#(pushed)"}}"#))
            #expect(Self.succeeds(connection, #"{"id":5,"op":"refresh","account":"b"}"#))
            initial["b-pushed"] = pushed
            for account in ["c", "d"] {
                #expect(Self.succeeds(connection, #"{"id":6,"op":"refresh","account":"\#(account)"}"#))
            }
            #expect(Self.succeeds(connection, #"{"id":7,"op":"remove","account":"c"}"#))
            #expect(Self.succeeds(connection, #"{"id":8,"op":"logout","account":"d"}"#))
            #expect(idps["d"]!.revocations.count == 1, "the logout revoked at the IdP")
            for account in ["a", "b"] {
                #expect(Self.succeeds(connection, #"{"id":9,"op":"token","account":"\#(account)"}"#))
            }
        }
        try await Task.sleep(for: .milliseconds(300))

        let live = ["a", "b"].compactMap { idps[$0]!.issuedRefreshTokens.last }
        let retired =
            Array(initial.values) + ["a", "b"].flatMap { idps[$0]!.issuedRefreshTokens.dropLast() }
            + ["c", "d"].flatMap { idps[$0]!.issuedRefreshTokens }
        // `add` of an oauth2 account with only a refresh token refreshes at once: 11 refreshes.
        #expect(live.count == 2 && retired.count == 14, "every refresh rotated the refresh token")
        let accessTokens = idps.values.flatMap(\.issuedAccessTokens)
        let clientSecrets = idps.values.map(\.clientSecret)
        let pid = try #require(broker.process?.pid)
        let scan = try await onOwnThread {
            try MemoryScan(pid: pid, needles: live + retired + accessTokens + clientSecrets)
        }
        #expect(scan.scannedBytes > 1 << 20, "the scan read the broker's memory")
        for token in retired {
            #expect(scan.places(of: token).isEmpty, "a retired refresh token in \(scan.places(of: token))")
        }
        for token in live {
            #expect(!scan.places(of: token).isEmpty, "the live refresh token is in memory somewhere")
            #expect(
                scan.unguardedPlaces(of: token).isEmpty, "a live refresh token in \(scan.unguardedPlaces(of: token))")
        }
        Self.report("live refresh tokens", live, scan)
        Self.report("retired refresh tokens", retired, scan)
        Self.report("access tokens", accessTokens, scan)
        Self.report("client secrets", clientSecrets, scan)
        for idp in idps.values { await idp.shutdown() }
    }

    @Test func lockLeavesNoTokenAndNoPassphraseInMemory() async throws {
        let broker = try BrokerProcess()
        try await broker.start(arguments: ["--passphrase"])
        defer { broker.stop() }
        let passphrase = "pp-" + longRandomHex()
        let initial = "rt-0-" + longRandomHex()
        let idp = try await OAuth2TestIdP(initialRefreshToken: initial, clientSecret: "cs-" + longRandomHex())
        idp.issueLongTokens()
        do {
            let connection = try RawConnection(path: broker.socketPath)
            #expect(Self.succeeds(connection, #"{"id":1,"op":"unlock","passphrase":"\#(passphrase)"}"#))
            let provider =
                #"{"kind":"oauth2","token_endpoint":"\#(idp.tokenEndpoint)","client_id":"\#(idp.clientID)","#
                + #""client_secret":"\#(idp.clientSecret)"}"#
            #expect(
                Self.succeeds(
                    connection,
                    #"{"id":2,"op":"add","account":"api","provider":\#(provider),"tokens":{"refresh_token":"\#(initial)"}}"#
                ))
            for _ in 0..<2 { #expect(Self.succeeds(connection, #"{"id":3,"op":"refresh","account":"api"}"#)) }
            #expect(Self.succeeds(connection, #"{"id":4,"op":"token","account":"api"}"#))
            #expect(Self.succeeds(connection, #"{"id":5,"op":"lock"}"#))
        }
        try await Task.sleep(for: .milliseconds(300))

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

    /// Sends `line` and tells whether the answer is a success.
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
