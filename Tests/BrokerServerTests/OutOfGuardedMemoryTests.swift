@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerServer
@testable import BrokerVault
import Foundation
import Logging
import Testing
import TestSupport

/// A secret that finds no guarded memory refuses the request that brought it, with an error
/// that says so, and the broker goes on serving: the request runs with an arena that can map
/// nothing (`SecretArena.current`, standing for a kernel that refuses the mapping).
@Suite struct OutOfGuardedMemoryTests {
    static let caller = Caller(
        peer: PeerIdentity(pid: 1, uid: getuid(), gid: getgid()), facts: ProcessFacts(executable: nil, unit: nil))

    static func request(_ line: String) throws -> Request {
        try Wire.makeDecoder().decode(Request.self, from: Data(line.utf8))
    }

    @Test func anAddWhoseSecretsFindNoMemoryIsRefusedAndTheBrokerGoesOn() async throws {
        try await BrokerHarness.run { harness in
            try await harness.addWithValidToken()
            let dispatcher = RequestDispatcher(broker: harness.broker, policy: AccessPolicy(logger: Logger(label: "t")))
            let add = try Self.request(
                #"{"id":7,"op":"add","account":"pushed","provider":{"kind":"static"},"#
                    + #""tokens":{"access_token":"at-pushed-2","expires_in":600,"refresh_token":"rt-pushed"}}"#)
            let exhausted = SecretArena(pages: GuardedPages(budget: 0))
            let refused = await SecretArena.$current.withValue(exhausted) {
                await dispatcher.run(add, caller: Self.caller)
            }
            let answer = try #require(
                try JSONSerialization.jsonObject(with: Data(refused)) as? [String: Any], "not JSON")
            let error = try #require(answer["error"] as? [String: Any], "not an error: \(answer)")
            #expect(error["code"] as? String == "internal")
            #expect((error["message"] as? String)?.hasPrefix("the broker is out of guarded memory for secrets") == true)
            #expect(answer["id"] as? Int == 7)
            #expect(try await harness.broker.status(account: nil).map(\.account) == ["api"], "nothing was added")

            let token = await dispatcher.run(
                try Self.request(#"{"id":8,"op":"token","account":"api"}"#), caller: Self.caller)
            #expect(String(decoding: token, as: UTF8.self).contains(#""access_token":"at-pushed""#))
            let added = await dispatcher.run(add, caller: Self.caller)
            #expect(String(decoding: added, as: UTF8.self).contains(#""ok":true"#), "with memory, the same add runs")
        }
    }
}
