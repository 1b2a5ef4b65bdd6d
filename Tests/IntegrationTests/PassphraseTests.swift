import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Passphrase mode through the real brokerd and brokerctl: a broker that starts locked (and
/// tells systemd it is ready), answers `locked` on both token paths, unlocks with brokerctl
/// reading the passphrase from stdin, makes a wrong one wait, forgets at lock, refreshes at
/// unlock what came due meanwhile, and moves between the key file and a passphrase across
/// restarts; neither the passphrase nor its key ever reaches a file.
@Suite(.serialized) struct PassphraseTests {
    static let passphrase = "a passphrase only the test knows"

    @Test func aLockedBrokerAnswersLockedOnBothTokenPathsUntilUnlockedAndForgetsAtLock() async throws {
        let broker = try BrokerProcess()
        try await broker.start(arguments: ["--passphrase"])
        defer { broker.stop() }
        let connection = try RawConnection(path: broker.socketPath)
        #expect(connection.request(#"{"id":1,"op":"hello"}"#)?.contains(#""ok":true"#) == true)
        let status = try #require(connection.readObjectAfter(#"{"id":2,"op":"status"}"#))
        #expect(status.resultObject?["locked"] as? Bool == true && status.resultObject?["new_vault"] as? Bool == true)
        // The flat fast path, and a token line the full decoder reads.
        for line in [
            #"{"id":3,"op":"token","account":"api"}"#, #"{"id":4,"op":"token","account":"api","id_token":false}"#,
            #"{"id":5,"op":"add","account":"api","provider":{"kind":"static"}}"#,
            #"{"id":6,"op":"reload"}"#, #"{"id":7,"op":"subscribe"}"#,
        ] {
            let answer = try #require(connection.readObjectAfter(line))
            #expect(answer.errorCode == "locked", "\(line)")
        }

        let unlocked = try await broker.brokerctl(["unlock"], stdin: Self.passphrase + "\n")
        #expect(unlocked.status == 0, "\(unlocked.stderr)")
        #expect(unlocked.stdout.contains("passphrase set"))
        let client = try broker.client()
        defer { client.close() }
        _ = try await client.add(
            account: "api", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "at-static-1", expiresIn: 3600))
        #expect(try await broker.brokerctl(["token", "api"]).stdout == "at-static-1\n")

        #expect(try await broker.brokerctl(["lock"]).status == 0)
        let refused = try await broker.brokerctl(["token", "api"])
        #expect(refused.status == 8 && refused.stderr.contains("locked; run brokerctl unlock"))
        #expect(
            try #require(connection.readObjectAfter(#"{"id":8,"op":"token","account":"api"}"#)).errorCode == "locked")
        let listed = try await broker.brokerctl(["status"])
        #expect(listed.status == 0 && listed.stdout.contains("locked; run brokerctl unlock"))
        #expect(listed.stdout.contains("api") && listed.stdout.contains("static"))

        let start = Date()
        let wrong = try await broker.brokerctl(["unlock"], stdin: "not it\n")
        #expect(wrong.status == 7 && wrong.stderr.contains("wrong passphrase"))
        #expect(Date().timeIntervalSince(start) >= 1, "a wrong passphrase waits at least a second")
        #expect(try await broker.brokerctl(["unlock"], stdin: Self.passphrase + "\n").status == 0)
        #expect(try await broker.brokerctl(["token", "api"]).stdout == "at-static-1\n")
        #expect(
            try await broker.brokerctl(["unlock"], stdin: "").stdout.contains("unlocked"),
            "no passphrase asked")

        // Neither the passphrase nor the key it derives is in a file brokerd wrote, or its log.
        let key = try await onOwnThread {
            try PassphraseVaultFile.key(at: broker.vaultPath, passphrase: Self.passphrase)
        }
        #expect(PassphraseVaultFile.version(at: broker.vaultPath) == 3)
        let files = broker.storedFiles()
        #expect(files.contains { $0.path == broker.vaultPath })
        for file in files {
            // Checked outside #expect, whose failure message would print the secret.
            let (passphraseWritten, keyWritten) = (
                file.bytes.contains(Self.passphrase), file.bytes.range(of: key) != nil
            )
            #expect(!passphraseWritten, "the passphrase in \(file.path)")
            #expect(!keyWritten, "the vault key in \(file.path)")
            #expect(!file.bytes.contains("at-static-1"), "a token in plaintext in \(file.path)")
        }
        #expect(!FileManager.default.fileExists(atPath: broker.keyPath), "no key file in passphrase mode")
        let passphraseLogged = broker.log.contains(Self.passphrase) || broker.log.contains("not it")
        #expect(!passphraseLogged, "a passphrase in the broker's log")
    }

    /// The wrong-passphrase delay is kept beside the vault: a restart neither resets the count
    /// nor cuts a delay short, even one brokerd was killed in.
    @Test func theWrongPassphraseDelaySurvivesARestart() async throws {
        let broker = try BrokerProcess()
        try await broker.start(arguments: ["--passphrase"])
        defer { broker.stop() }
        #expect(try await broker.brokerctl(["unlock"], stdin: Self.passphrase + "\n").status == 0)
        #expect(try await broker.brokerctl(["lock"]).status == 0)
        for (attempt, delay) in [(1, 1.0), (2, 2.0)] {
            let start = Date()
            let wrong = try await broker.brokerctl(["unlock"], stdin: "not it \(attempt)\n")
            #expect(wrong.status == 7 && Date().timeIntervalSince(start) >= delay)
        }
        let paceFile = broker.vaultPath + ".unlock-pace"
        var info = stat()
        #expect(lstat(paceFile, &info) == 0 && info.st_mode & 0o777 == 0o600)
        let pace = { (try? String(contentsOfFile: paceFile, encoding: .utf8)) ?? "" }
        #expect(pace().hasPrefix("failures=2\n"))

        // Restarted, the third wrong one in a row waits 4 s; brokerd is killed in that wait.
        broker.crash()
        try await broker.start(arguments: ["--passphrase"])
        let third = Task { try await broker.brokerctl(["unlock"], stdin: "not it 3\n") }
        #expect(await eventually { pace().hasPrefix("failures=3\n") })
        // When that delay ends, from the file (this task may have seen the file late on a loaded machine).
        let until = try #require(
            pace().split(separator: "\n").first { $0.hasPrefix("until=") }.flatMap { Double($0.dropFirst(6)) },
            "\(pace())")
        broker.crash()
        #expect(try await third.value.status != 0)

        // Restarted again, even the right passphrase waits out the rest of that delay.
        let restarted = Date().timeIntervalSince1970
        try await broker.start(arguments: ["--passphrase"])
        let right = try await broker.brokerctl(["unlock"], stdin: Self.passphrase + "\n")
        #expect(right.status == 0, "\(right.stderr)")
        // `until` is in whole seconds.
        #expect(Date().timeIntervalSince1970 >= until - 1, "the 4 s delay ran on across the restart")
        // Said when there was a delay left to wait (a loaded machine may restart after its end).
        #expect(
            restarted >= until - 1
                || broker.log.contains("unlock waits out the delay of a wrong passphrase given before a restart"))
        #expect(!FileManager.default.fileExists(atPath: paceFile), "a right passphrase clears the pace")
        #expect(!broker.log.contains(Self.passphrase))
    }

    @Test func aLockedBrokerIsReadyForSystemdAndSaysItIsLocked() async throws {
        let broker = try BrokerProcess()
        try broker.writeConfig("[broker]\nkey = \"passphrase\"\n")
        let notifyPath = broker.root.appendingPathComponent("notify.sock").path
        let notify = try DatagramListener(path: notifyPath)
        try await broker.startWithNotifySocket(notifyPath)
        defer { broker.stop() }
        var ready: String?
        while ready == nil, let message = notify.receive() {
            if message.contains("READY=1") { ready = message }
        }
        #expect(ready?.contains("STATUS=locked (run brokerctl unlock)") == true)
        let client = try broker.client()
        defer { client.close() }
        #expect(try await client.status().isEmpty)
        await #expect(throws: BrokerError(.locked, "")) { try await client.token(account: "api") }
    }

    @Test func rekeyMovesTheVaultFromTheKeyFileToAPassphraseAndBackAcrossRestarts() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        let client = try broker.client()
        _ = try await client.add(
            account: "api", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "at-kept", expiresIn: 3600))
        client.close()
        #expect(FileManager.default.fileExists(atPath: broker.keyPath))
        #expect(try await broker.brokerctl(["lock"]).status == 1, "no lock under the key file")

        let differ = try await broker.brokerctl(["rekey"], stdin: "")
        #expect(differ.status != 0, "no passphrase, nothing changed")
        let moved = try await broker.brokerctl(["rekey", "--to", "passphrase"], stdin: "new passphrase\n")
        #expect(moved.status == 0, "\(moved.stderr)")
        #expect(moved.stdout.contains("key = \"passphrase\""))
        #expect(!FileManager.default.fileExists(atPath: broker.keyPath), "the key file is gone")
        #expect(PassphraseVaultFile.version(at: broker.vaultPath) == 3)

        broker.stop()
        try await broker.start()
        #expect(broker.log.contains("sealed with a passphrase; starting locked"))
        #expect(try await broker.brokerctl(["token", "api"]).status == 8)
        #expect(try await broker.brokerctl(["unlock"], stdin: "new passphrase\n").status == 0)
        #expect(try await broker.brokerctl(["token", "api"]).stdout == "at-kept\n")

        let back = try await broker.brokerctl(["rekey", "--to", "keyfile"])
        #expect(back.status == 0, "\(back.stderr)")
        #expect(FileManager.default.fileExists(atPath: broker.keyPath))
        #expect(PassphraseVaultFile.version(at: broker.vaultPath) == 2)
        broker.stop()
        try await broker.start()
        #expect(try await broker.brokerctl(["token", "api"]).stdout == "at-kept\n", "unlocked at start")
        broker.stop()

        // A passphrase asked for is never dropped: a vault under the key file is refused then.
        try broker.writeConfig("[broker]\nkey = \"passphrase\"\n")
        #expect(try await broker.runExpectingExit() != 0)
        #expect(broker.log.contains("sealed with the key file, not a passphrase"))
    }

    @Test func aRefreshThatCameDueWhileLockedRunsRightAfterUnlock() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-locked", lifetime: 2)
        let broker = try BrokerProcess()
        try broker.writeConfig("[broker]\noverdue_spread = 0\n")
        try await broker.start(arguments: ["--passphrase"])
        defer { broker.stop() }
        #expect(try await broker.brokerctl(["unlock"], stdin: "pw\n").status == 0)
        let client = try broker.client()
        _ = try await client.add(
            account: "api",
            provider: ProviderSpec(
                kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)]),
            tokens: TokenSet(refreshToken: "rt-locked"))
        _ = try await client.token(account: "api", minTTL: 0)
        client.close()
        #expect(try await broker.brokerctl(["lock"]).status == 0)
        let callsAtLock = idp.callCount
        // Waits on brokerd, locked, until its 2-second token has come due (a second past it).
        let issued = try #require(idp.refreshCalls.last?.at)
        try await Task.sleep(for: .seconds(max(0, issued.addingTimeInterval(3).timeIntervalSinceNow)))
        #expect(idp.callCount == callsAtLock, "nothing is refreshed while locked")
        #expect(try await broker.brokerctl(["unlock"], stdin: "pw\n").status == 0)
        #expect(
            await eventually(timeout: 3) { idp.callCount > callsAtLock },
            "the refresh that came due ran after unlock, before any request")
        let served = try await broker.brokerctl(["token", "api", "--min-ttl", "0"])
        #expect(idp.issuedAccessTokens.contains(String(served.stdout.dropLast())))
        #expect(idp.rejectedReuse == 0)
        await idp.shutdown()
    }
}

extension RawConnection {
    /// Sends `line` and reads the answer as an object.
    func readObjectAfter(_ line: String) -> [String: Any]? {
        guard send(line + "\n") else { return nil }
        return readObject()
    }
}

extension Dictionary where Key == String, Value == Any {
    /// The `result` object of an answer.
    var resultObject: [String: Any]? { self["result"] as? [String: Any] }
}
