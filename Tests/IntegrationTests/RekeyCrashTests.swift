import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// brokerd killed with SIGKILL at random instants during repeated rekeys (key file to
/// passphrase, passphrase to passphrase, passphrase to key file) of a 300-account vault: after
/// every kill the vault opens with the old key or the new one, and holds every account. Half the
/// kills land anywhere in the rekey's uninterrupted time, half around its end (80% to 160% of
/// it), where the files are written (most of its time is the Argon2id derivation); the test of
/// each step in `PassphraseVaultTests` stops at every point.
@Suite(.serialized) struct RekeyCrashTests {
    static let kills = 20
    static let accounts = 300

    /// The key a rekey leaves: a passphrase, or the key file (`nil`).
    typealias Key = String?

    @Test func aVaultKilledDuringRekeysOpensWithTheOldOrTheNewKey() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        let client = try broker.client()
        for index in 0..<Self.accounts {
            _ = try await client.add(
                account: "s-\(index)", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: Self.token(index), expiresIn: 86_400))
        }
        client.close()
        defer { broker.stop() }

        // How long an uninterrupted rekey of each kind takes, to aim kills at its end.
        var current: Key = nil
        let toPassphrase = try await Self.timedRekey(broker, to: "first")
        current = "first"
        let toKeyFile = try await Self.timedRekey(broker, to: nil)
        current = nil
        var opened = (old: 0, new: 0)
        for round in 0..<Self.kills {
            let target: Key = current == nil || round % 3 == 1 ? "pass-\(round)" : nil
            let duration = target == nil ? toKeyFile : toPassphrase
            let delay = duration * (round % 2 == 0 ? Double.random(in: 0...1) : Double.random(in: 0.8...1.6))
            let connection = try RawConnection(path: broker.socketPath)
            #expect(connection.send(Self.rekeyLine(to: target) + "\n"))
            // brokerd rekeys until the kill, aimed at the end of its rekey.
            try await Task.sleep(for: .milliseconds(Int(delay * 1000)))
            broker.crash()

            try await broker.start()
            let opening = try await Self.open(broker, candidates: [target, current])
            if opening == target { opened.new += 1 } else { opened.old += 1 }
            current = opening
            try await Self.checkAccounts(broker)
        }
        print(
            "rekey crash test: \(Self.kills) SIGKILLs during rekeys of \(Self.accounts) accounts "
                + "(uninterrupted: \(Int(toPassphrase * 1000)) ms to a passphrase, \(Int(toKeyFile * 1000)) ms to the "
                + "key file); the vault opened with the old key \(opened.old) times, with the new one \(opened.new)")
        #expect(opened.old + opened.new == Self.kills)
    }

    static func token(_ index: Int) -> String { "at-\(index)-" + String(repeating: "x", count: 800) }

    static func rekeyLine(to key: Key) -> String {
        key.map { #"{"id":1,"op":"rekey","to":"passphrase","passphrase":"\#($0)"}"# }
            ?? #"{"id":1,"op":"rekey","to":"keyfile"}"#
    }

    /// Rekeys the running broker to `key` and returns the seconds it took.
    static func timedRekey(_ broker: BrokerProcess, to key: Key) async throws -> Double {
        let path = broker.socketPath
        let line = rekeyLine(to: key)
        let start = Date()
        let answer = try await onOwnThread { try RawConnection(path: path).request(line) ?? "no answer" }
        #expect(answer.contains(#""ok":true"#), "\(answer)")
        return Date().timeIntervalSince(start)
    }

    /// Unlocks a restarted broker with the first of `candidates` that opens its vault (a key
    /// file vault is open at start), and returns it; fails when none does.
    static func open(_ broker: BrokerProcess, candidates: [Key]) async throws -> Key {
        let client = try broker.client()
        defer { client.close() }
        let status: StatusResult = try await client.perform(BrokerCall(Request(id: nil, op: "status")))
        guard status.locked == true else {
            #expect(candidates.contains(nil), "the vault opened with a key file that was not one of the two keys")
            return nil
        }
        for case let passphrase? in candidates {
            if (try? await client.perform(.unlock(passphrase: passphrase))) != nil { return passphrase }
        }
        Issue.record("neither the old nor the new passphrase opens the vault: \(broker.log)")
        throw HarnessError("vault lost")
    }

    /// Every account is there, and a sample serves its token.
    static func checkAccounts(_ broker: BrokerProcess) async throws {
        let client = try broker.client()
        defer { client.close() }
        #expect(try await client.status().count == accounts)
        for index in [0, 1, accounts / 2, accounts - 1] {
            #expect(try await client.token(account: "s-\(index)", minTTL: 0).accessToken == token(index))
        }
    }
}
