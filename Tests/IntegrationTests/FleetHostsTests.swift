import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Three brokerd, each on a host of its own (a network namespace on a bridge), share one account
/// on a real IdP (django-oauth-toolkit: rotation, reuse protection) through one PostgreSQL, under
/// a few hundred clients; then faults: the lease holder killed before its IdP call and while the
/// IdP answers, the holder cut from the database between the IdP's answer and its commit,
/// PostgreSQL restarted, and PostgreSQL gone for three token lifetimes. Every answer is checked
/// against the IdP's own record of when each access token was live.
///
/// One configuration throughout: access tokens of 10 s (4 leases: the token the IdP's grace
/// period replays after a holder was killed at the IdP lives that long, since no broker can
/// tell its real age), a lease of 2.5 s (3 IdP timeouts of 0.8 s and a little: 3 x 0.8 is
/// 2.4000000000000004 in binary), refreshes at half a lifetime (5 s left: a killed holder's
/// lease lapses with 2.5 s to spare), and an IdP grace of 10 s (longer than the lease), within
/// which a refresh token the IdP rotated for a holder that never committed may be presented
/// again by the next holder.
@Suite(
    .serialized,
    .enabled(
        if: NetworkNamespaces.isAvailable && PostgresServer.isInstalled && DjangoOAuthIdP.isInstalled,
        "needs root, iproute2, Debian's postgresql and the IdP's virtualenv (scripts/install-deps)"))
struct FleetHostsTests {
    static let hosts = 3
    static let clientsPerHost = 100
    static let lifetime = 10.0
    static let requestTimeout = 0.8
    static let lease = 2.5
    static let grace = 10
    /// Clock granularity allowed when an answer is checked against the IdP's record.
    static let slack = 0.1
    static let launcher = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Fixtures/django-idp.py").path

    @Test func threeHostsShareOneAccountThroughRotationsAndFaults() async throws {
        let network = try await NetworkNamespaces.make(hosts: Self.hosts)
        defer { network.remove() }
        let server = try await PostgresServer.start(listenAddress: network.bridgeAddress)
        defer { server.stop() }
        let idp = try await DjangoOAuthIdP.start(
            launcher: Self.launcher, address: network.bridgeAddress, port: try freePort(),
            accessTokenSeconds: Int(Self.lifetime), graceSeconds: Self.grace)
        defer { idp.stop() }
        // The same port on every host's loopback: the account's endpoint is one URL for all.
        let proxyPort = Int.random(in: 20000...40000)
        let proxy = TokenEndpointProxy(
            listeners: try await onOwnThread {
                try (0..<Self.hosts).map { try network.listener(host: $0, port: proxyPort) }
            },
            upstreamAddress: network.bridgeAddress, port: idp.port)
        defer { proxy.stop() }
        let keys = try TemporaryDirectory()
        defer { keys.remove() }
        let key = keys.file("fleet.key")
        #expect(try FleetStartTests.fleetInit(key).status == 0)

        let database = "postgresql://\(server.username)@\(network.bridgeAddress):\(server.port)/\(server.database)"
        let brokers = try (0..<Self.hosts).map { host in
            let broker = try FleetStartTests.broker(
                on: server, key: key, host: "h\(host + 1)", database: database,
                broker: """
                    request_timeout = \(Self.requestTimeout)
                    refresh_fraction = 0.5
                    backoff_cap = 2
                    outage_probe_interval = 1
                    """,
                fleet: "lease_seconds = \(Self.lease)\ntls = \"disable\"")
            broker.launcher = network.launcher(host: host)
            return broker
        }
        defer { for broker in brokers { broker.stop() } }
        for broker in brokers { try await broker.start() }

        let added = try await brokers[0].brokerctl(
            [
                "add", "api", "--shared", "--kind", "oauth2", "--token-endpoint",
                "http://127.0.0.1:\(proxyPort)\(DjangoOAuthIdP.tokenPath)", "--client-id", idp.clientID,
                "--secrets", "-",
            ],
            stdin: #"{"refresh_token": "\#(idp.initialRefreshToken)", "client_secret": "\#(idp.clientSecret)"}"#)
        try #require(added.status == 0, "add --shared failed: \(added.stderr)")

        // The other hosts serve the account from their next read of the store (once a lease).
        for broker in brokers {
            let client = try broker.client()
            defer { client.close() }
            _ = await eventually(timeout: 2 * Self.lease + 5) {
                (try? await client.token(account: "api", minTTL: 1)) != nil
            }
        }

        let load = FleetLoad(account: "api", socketPaths: brokers.map(\.socketPath), perHost: Self.clientsPerHost)
        load.start()
        let fleet = Fleet(network: network, server: server, idp: idp, proxy: proxy, brokers: brokers)
        do {
            try await fleet.run(load)
        } catch {
            await load.stop()
            throw error
        }
        await load.stop()
        try await fleet.check(load.all)
    }
}

/// What the test drives: the hosts, the database, the IdP and its proxy; each step and its
/// measured figures.
private final class Fleet: @unchecked Sendable {
    let network: NetworkNamespaces
    let server: PostgresServer
    let idp: DjangoOAuthIdP
    let proxy: TokenEndpointProxy
    let brokers: [BrokerProcess]
    /// Each fault's phase and the instant from which every host served a token the IdP called
    /// active (nil: not within the bound); answers after it must all be valid.
    var recoveries: [(phase: String, at: Date?)] = []
    /// The IdP's record at the end of the steady load.
    var afterLoad: DjangoOAuthIdP.Record?

    init(
        network: NetworkNamespaces, server: PostgresServer, idp: DjangoOAuthIdP, proxy: TokenEndpointProxy,
        brokers: [BrokerProcess]
    ) {
        (self.network, self.server, self.idp, self.proxy, self.brokers) = (network, server, idp, proxy, brokers)
    }

    typealias T = FleetHostsTests

    /// The steady load for ten token lifetimes, then each fault in turn.
    func run(_ load: FleetLoad) async throws {
        try await underLoad(for: 10 * T.lifetime)
        afterLoad = try await idp.record()

        // a. The holder killed before its IdP call (its request held at the proxy, then dropped),
        // and restarted at once.
        try await killHolder(phase: "a", holding: .request, load)

        // b. The holder killed while the IdP answers: the IdP rotated, no broker ever saw it; the
        // next holder presents the same refresh token within the IdP's grace.
        try await killHolder(phase: "b", holding: .answer, load)

        // c. The holder cut from the database after the IdP answered, before its commit; the link
        // restored two leases later.
        load.enter("c")
        proxy.holdNext(.answer)
        let cut = try await proxy.waitForHeld(seconds: 2 * T.lifetime)
        try await onOwnThread { try self.network.cut(host: cut) }
        let fault = Date()
        proxy.release()
        let others = (0..<T.hosts).filter { $0 != cut }
        try await recovered("c (other hosts)", since: fault, within: T.lease + T.requestTimeout, hosts: others)
        try await underLoad(for: 2 * T.lease)
        try await onOwnThread { try self.network.restore(host: cut) }
        try await recovered("c", since: Date(), within: T.lease + T.requestTimeout)
        try await nextRotation()

        // d. PostgreSQL restarted under load.
        load.enter("d")
        try await onOwnThread { self.server.halt() }
        try await server.resume()
        try await recovered("d", since: Date(), within: T.lease + T.requestTimeout)
        try await nextRotation()

        // e. PostgreSQL gone for three token lifetimes: tokens served while valid, then
        // `unavailable`; back within a lease of its return.
        load.enter("e")
        try await onOwnThread { self.server.halt() }
        try await underLoad(for: 3 * T.lifetime)
        try await server.resume()
        load.enter("e (back)")
        try await recovered("e", since: Date(), within: T.lease + T.requestTimeout)
        load.enter("after")
        try await nextRotation()
        try await nextRotation()
    }

    /// The hosts serve the load for `seconds` as they are: steady, with a host cut from the
    /// database, or without PostgreSQL.
    func underLoad(for seconds: Double) async throws {
        try await Task.sleep(for: .seconds(seconds))
    }

    /// Faults a and b: the lease holder killed while the proxy holds its refresh at `point`
    /// (before the IdP sees it, or after the IdP answered), restarted at once; every host serves
    /// again within a lease and an IdP timeout, and the chain goes on.
    func killHolder(phase: String, holding point: TokenEndpointProxy.HoldPoint, _ load: FleetLoad) async throws {
        load.enter(phase)
        proxy.holdNext(point)
        let holder = try await proxy.waitForHeld(seconds: 2 * T.lifetime)
        try await expectLeaseHeld(by: holder)
        brokers[holder].crash()
        let fault = Date()
        proxy.release()
        try await brokers[holder].start()
        try await recovered(phase, since: fault, within: T.lease + T.requestTimeout)
        try await nextRotation()
    }

    /// While the proxy holds `host`'s refresh, that host's status names it the lease holder.
    func expectLeaseHeld(by host: Int) async throws {
        let client = try brokers[host].client()
        defer { client.close() }
        let status = try await client.status(account: "api").first
        #expect(status?.leaseHolder?.hasPrefix("h\(host + 1)") == true, "the held refresh's host holds the lease")
    }

    /// Waits until every one of `hosts` serves a token the IdP's introspection calls active;
    /// expects that within `seconds` of `start`, and notes the figure.
    func recovered(
        _ phase: String, since start: Date, within seconds: Double, hosts: [Int]? = nil
    ) async throws {
        var pending = Set(hosts ?? Array(0..<T.hosts))
        _ = try await eventually(timeout: start.addingTimeInterval(seconds + 30).timeIntervalSinceNow) {
            for host in pending {
                guard let client = try? brokers[host].client() else { continue }
                defer { client.close() }
                if let token = try? await client.token(account: "api", minTTL: 1),
                    try await idp.isActive(token.accessToken)
                {
                    pending.remove(host)
                }
            }
            return pending.isEmpty
        }
        let took = Date().timeIntervalSince(start)
        print("fleet: \(phase): every host served a valid token \(String(format: "%.2f", took)) s after the fault")
        #expect(pending.isEmpty && took <= seconds, "\(phase): hosts \(pending.sorted()) not serving within \(took) s")
        if hosts == nil { recoveries.append((phase, pending.isEmpty ? Date() : nil)) }
    }

    /// Waits (up to two lifetimes) until the IdP has made one more rotation: the chain goes on.
    func nextRotation() async throws {
        let before = try await idp.record().refreshTokens.count
        if try await eventually(timeout: 2 * T.lifetime, { try await idp.record().refreshTokens.count > before }) {
            return
        }
        Issue.record("no rotation within two token lifetimes")
    }

    /// Every answer against the IdP's record, then the chain.
    func check(_ answers: [FleetLoad.Answer]) async throws {
        let record = try await idp.record()
        let lives = Dictionary(record.accessTokens.map { ($0.token, $0) }, uniquingKeysWith: { $1 })
        let phases = ["load", "a", "b", "c", "d", "e", "e (back)", "after"]
        for phase in phases {
            let mine = answers.filter { $0.phase == phase }
            let recovery = recoveries.first { $0.phase.first == phase.first }?.at
            var (tokens, invalid, invalidAfterRecovery, expired) = (0, 0, 0, 0)
            // How long after the IdP revoked (or expired) it the worst inactive token was served.
            var latest = 0.0
            var errors: [String: Int] = [:]
            var slowest = 0.0
            for answer in mine {
                slowest = max(slowest, answer.answered.timeIntervalSince(answer.asked))
                switch answer.outcome {
                case .token(let token, let expiresAt):
                    tokens += 1
                    if answer.answered > expiresAt.addingTimeInterval(T.slack) { expired += 1 }
                    let live = lives[token]
                    guard live?.wasActive(from: answer.asked, to: answer.answered, grace: T.slack) != true else {
                        continue
                    }
                    invalid += 1
                    if let live {
                        latest = max(
                            latest, answer.asked.timeIntervalSince1970 - min(live.expires, live.deleted ?? .infinity))
                    }
                    if let recovery, answer.asked > recovery { invalidAfterRecovery += 1 }
                case .error(let code): errors[code.rawValue, default: 0] += 1
                case .noBroker: errors["no broker", default: 0] += 1
                case .stalled: errors["stalled", default: 0] += 1
                }
            }
            print(
                "fleet: phase \(phase): \(mine.count) answers, \(tokens) tokens, \(invalid) not active at the IdP "
                    + "when served (\(invalidAfterRecovery) after recovery; "
                    + "up to \(String(format: "%.2f", latest)) s after the IdP revoked them), \(expired) expired, errors \(errors), "
                    + "slowest \(String(format: "%.2f", slowest)) s")
            #expect(expired == 0, "phase \(phase): \(expired) answers held an expired token")
            #expect(errors["needs_login"] == nil, "phase \(phase): needs_login")
            #expect(errors["stalled"] == nil && slowest <= 15, "phase \(phase): an answer took \(slowest) s")
            switch phase {
            case "load", "a", "d", "e", "e (back)", "after":
                // No credential rotated outside a commit here: every token served is live.
                #expect(invalid == 0, "phase \(phase): \(invalid) of \(tokens) tokens were not active when served")
            default:
                // b, c: the IdP rotated (and so revoked the access token every host held) for a
                // holder that did not commit; tokens are valid again from the recovery on.
                #expect(invalidAfterRecovery == 0, "phase \(phase): \(invalidAfterRecovery) inactive after recovery")
            }
            let allowed: Set<String> =
                switch phase {
                case "a", "b": ["no broker"]
                // c, d: a host that cannot reach the database while a rotation is under way has no
                // token it knows the IdP still honours (docs/fleet.md, "Notifications").
                case "c", "d", "e": ["unavailable"]
                // As PostgreSQL returns, a client's refresh may have failed less than
                // `minimum_refresh_interval` ago: `busy`, with a retry delay.
                case "e (back)": ["unavailable", "busy"]
                default: []
                }
            #expect(Set(errors.keys).isSubset(of: allowed), "phase \(phase): errors \(errors)")
        }
        let unavailable = answers.contains {
            if case .error(.unavailable) = $0.outcome { $0.phase == "e" } else { false }
        }
        #expect(unavailable, "unavailable once the tokens expired in the outage")

        // The steady load: one IdP refresh per rotation, the family never revoked.
        if let afterLoad {
            let rotations = afterLoad.refreshTokens.count - 1
            print("fleet: steady load: \(rotations) rotations, \(afterLoad.tokenRequests) IdP refresh requests")
            #expect(rotations >= 10, "the account was refreshed (\(rotations) rotations)")
            #expect(afterLoad.tokenRequests == rotations, "one IdP refresh per rotation")
        }
        // Over the whole test: each rotation's refresh token consumed by a refresh, none revoked
        // by reuse protection, the last one live; IdP calls beyond the rotations are the two
        // replays within the grace (b and c).
        let rotations = record.refreshTokens.count - 1
        let revokedUnconsumed = record.refreshTokens.filter { $0.revoked != nil && !$0.consumed }.count
        print(
            "fleet: whole test: \(rotations) rotations, \(record.tokenRequests) IdP refresh requests, "
                + "proxy saw \(proxy.requests) per host, \(answers.count) answers")
        #expect(
            revokedUnconsumed == 0, "\(revokedUnconsumed) refresh tokens revoked without a refresh (reuse protection)")
        #expect(record.refreshTokens.last?.revoked == nil, "the last refresh token is live")
        #expect(record.tokenRequests <= rotations + 2, "at most one replay within the grace for each of b and c")
        // The versions each host shows: the same row, one version per rotation at most.
        for broker in brokers {
            let client = try broker.client()
            defer { client.close() }
            let status = try await client.status(account: "api").first
            #expect(status?.shared == true && (status?.version ?? 0) <= Int64(rotations) + 1)
        }
    }
}
