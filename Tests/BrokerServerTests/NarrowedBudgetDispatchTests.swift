import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
@testable import BrokerServer
import BrokerVault
import Foundation
import Logging
import Testing
import TestSupport

/// The dispatcher charges a scoped `token` request to its caller's uid (docs/limits.md): once
/// one uid has spent its budget on an account, another uid listed for it still gets its own.
@Suite struct NarrowedBudgetDispatchTests {
    @Test func eachUIDSpendsItsOwnBudget() async throws {
        try await BrokerHarness.run { h in
            try await h.addWithValidToken()
            let dispatcher = RequestDispatcher(broker: h.broker, policy: AccessPolicy(logger: Logger(label: "test")))
            func caller(uid: UInt32) -> Caller {
                Caller(peer: PeerIdentity(pid: 1, uid: uid, gid: uid), facts: ProcessFacts(executable: nil, unit: nil))
            }
            func ask(_ scope: String, as uid: UInt32) async throws -> [String: Any] {
                let line = #"{"id":1,"op":"token","account":"api","scope":"\#(scope)"}"#
                let request = try JSONDecoder().decode(Request.self, from: Data(line.utf8))
                let answer = await dispatcher.run(request, caller: caller(uid: uid))
                return try #require(try JSONSerialization.jsonObject(with: Data(answer)) as? [String: Any])
            }
            let owner = getuid()
            for index in 0..<NarrowedRefreshBudget.burst {
                #expect(try await ask("s\(index)", as: owner)["ok"] as? Bool == true)
            }
            let refused = try await ask("more", as: owner)
            let error = try #require(refused["error"] as? [String: Any])
            #expect(error["code"] as? String == "busy")
            #expect(error["retry_after_ms"] as? Int == Int(NarrowedRefreshBudget.refill * 1000))
            #expect(try await ask("more", as: owner &+ 1)["ok"] as? Bool == true, "another uid has its own budget")
            #expect(h.idp.refreshCalls.count == NarrowedRefreshBudget.burst + 1)
        }
    }
}
