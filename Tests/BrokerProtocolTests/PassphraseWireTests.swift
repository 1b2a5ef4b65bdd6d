import BrokerProtocol
import Foundation
import Testing

/// The wire shapes of passphrase mode: `lock`, `unlock` and `rekey`, and `status` while locked.
@Suite struct PassphraseWireTests {
    static func object(_ data: Data) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    @Test func lockUnlockAndRekeyAreOwnerOperationsAndALockedBrokerRunsOnlyFour() {
        for op in [Operation.lock, .unlock, .rekey] { #expect(op.isOwnerOnly) }
        let running = Operation.allCases.filter(\.runsWhileLocked)
        #expect(running == [.hello, .status, .lock, .unlock])
    }

    @Test func thePassphraseAndTheTargetTravelInTheRequestAndNeverOnTheHandWrittenLine() throws {
        var request = Request(id: nil, op: "rekey")
        request.to = "passphrase"
        request.passphrase = "s3cret phrase"
        #expect(FlatRequest.line(of: request, id: .integer(1)) == nil, "the hand-written line would drop them")
        let sent = try Self.object(Wire.makeEncoder().encode(request))
        #expect(sent["to"] as? String == "passphrase" && sent["passphrase"] as? String == "s3cret phrase")
        let decoded = try Wire.makeDecoder().decode(
            Request.self, from: Data(#"{"id":1,"op":"unlock","passphrase":"pw"}"#.utf8))
        #expect(decoded.passphrase == "pw" && decoded.to == nil)
        #expect(throws: (any Error).self) {
            try Wire.makeDecoder().decode(Request.self, from: Data(#"{"id":1,"op":"unlock","passphrase":5}"#.utf8))
        }
    }

    @Test func resultsOmitWhatDoesNotApply() throws {
        let unlocked = try Self.object(Wire.makeEncoder().encode(StatusResult(accounts: [])))
        #expect(Set(unlocked.keys) == ["accounts"])
        let locked = try Self.object(
            Wire.makeEncoder().encode(StatusResult(accounts: [], locked: true, newVault: true)))
        #expect(locked["locked"] as? Bool == true && locked["new_vault"] as? Bool == true)
        let lock = try Self.object(Wire.makeEncoder().encode(LockResult(state: "locked")))
        #expect(Set(lock.keys) == ["state"])
        let rekey = try Self.object(Wire.makeEncoder().encode(RekeyResult(key: "passphrase", keyFileLeft: "/k")))
        #expect(rekey["key"] as? String == "passphrase" && rekey["key_file_left"] as? String == "/k")
    }
}
