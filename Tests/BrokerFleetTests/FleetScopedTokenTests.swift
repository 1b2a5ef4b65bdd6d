@testable import BrokerEngine
import BrokerFleet
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import PostgresNIO
import Testing
import TestSupport

/// Scoped tokens of a shared account take the account's lease and present the row's
/// credential, as its own refresh does; the credential the IdP rotated is committed before the
/// scoped token is served, and every host's next refresh presents it.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetScopedTokenTests {
    @Test(.timeLimit(.minutes(1))) func aScopedRefreshOnOneHostIsCommittedAndTheOthersPresentItsCredential()
        async throws
    {
        try await PostgresFleetStoreTests.withSharedAccount { a, b, store in
            a.idp.setOriginalGrant(scope: "read write")
            let (brokerA, brokerB) = (a.broker, b.broker)

            // b's scoped refresh takes the lease (and pauses for the others' notices), presents
            // the row's refresh token and commits the rotated one as version 2.
            let scoped = Task { try await brokerB.token(account: "api", minTTL: 30, scope: "read") }
            await b.clock.sleepersReached(1)
            b.clock.advance(by: 1)
            let read = try await scoped.value.result
            #expect(read.scope == "read" && read.accessToken != "at-pushed")
            let afterScoped = try #require(try await store("check").read("api"))
            #expect(afterScoped.version == 2 && afterScoped.leaseHolder == nil)
            #expect(afterScoped.record.token?.value.text == "at-pushed", "the account's own token stays")
            let rotated = try #require(a.idp.issuedRefreshTokens.first)
            #expect(afterScoped.record.secrets.refreshToken?.text == rotated)
            #expect(try await b.state().version == 2)
            #expect(try await b.broker.token(account: "api", minTTL: 30).result.accessToken == "at-pushed")

            // a, not yet told of that commit, reads it at a reject of the account's token: a row
            // that moved on with the same token is no refresh by another host, so a refreshes,
            // from the credential b's scoped refresh left.
            #expect(try await a.state().version == 1)
            let rejected = Task { try await brokerA.reject(account: "api", accessToken: "at-pushed", minTTL: 30) }
            await a.clock.sleepersReached(1)
            a.clock.advance(by: 1)
            let fresh = try await rejected.value.result.accessToken
            #expect(fresh != "at-pushed")
            let calls = a.idp.refreshCalls
            #expect(calls.map(\.refreshToken) == ["rt-0", rotated])
            #expect(calls.map(\.presentedCurrent) == [true, true])
            #expect(a.idp.rejectedReuse == 0)
            #expect(try await store("check").read("api")?.version == 3)
            #expect(try await a.state().version == 3)

            // b takes a's commit and serves its token; its next scoped token of another scope
            // presents the credential a's refresh left.
            await brokerB.fleetNotice(.committed("api"))
            #expect(try await brokerB.token(account: "api", minTTL: 30).result.accessToken == fresh)
            let write = Task { try await brokerB.token(account: "api", minTTL: 30, scope: "write") }
            await b.clock.sleepersReached(1)
            b.clock.advance(by: 1)
            #expect(try await write.value.result.scope == "write")
            #expect(a.idp.refreshCalls.map(\.presentedCurrent) == [true, true, true])
            #expect(try await store("check").read("api")?.version == 4)
            #expect(a.idp.rejectedReuse == 0)
        }
    }
}
