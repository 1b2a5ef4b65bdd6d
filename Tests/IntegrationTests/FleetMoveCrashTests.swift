import BrokerClient
import BrokerProtocol
import Foundation
import Synchronization
import TestSupport
import Testing

/// brokerd killed with SIGKILL at random moments of `share` and `unshare`, then started again on
/// the vault and database the kill left: the account is in exactly one usable place each time,
/// shared (its row, no local copy served) or local (no row), and serves its token.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetMoveCrashTests {
    static let kills = 60
    static let token = "at-ci-moved"

    @Test func aKillDuringAMoveLeavesTheAccountInExactlyOnePlace() async throws {
        let (server, keys, key) = try await FleetSharingTests.fleet()
        defer {
            server.stop()
            keys.remove()
        }
        // A short lease: a kill between taking it and using it holds the next unshare off 3 s.
        let broker = try FleetStartTests.broker(
            on: server, key: key, host: "a", broker: "request_timeout = 1", fleet: "lease_seconds = 3")
        try await broker.start()
        defer { broker.stop() }
        let added = try await broker.brokerctl(
            ["add", "ci", "--kind", "static", "--secrets", "-"],
            stdin: #"{"access_token": "\#(Self.token)", "expires_in": 3600}"#)
        #expect(added.status == 0, "\(added.stderr)")

        // How long a whole move takes here (the median of 8). Most kills wait for the move's first
        // write to the vault (its mark), then land at a random moment within that time; one in
        // four lands at a random moment from the request on.
        var shared = false
        var durations: [Double] = []
        for _ in 0..<8 {
            let started = Date()
            try await Self.move(broker, shared: shared)
            durations.append(Date().timeIntervalSince(started))
            shared.toggle()
        }
        let window = durations.sorted()[durations.count / 2]

        var tookEffect = 0
        for kill in 1...Self.kills {
            let client = try broker.client()
            let before = Self.vaultState(broker)
            let ended = Mutex(false)
            let moving = Task { [shared] in
                defer { ended.withLock { $0 = true } }
                try await Self.move(client, shared: shared)
            }
            // brokerd moves the account until the kill: at once, or once the vault shows the move's
            // mark (looked at every millisecond, until the move's end: one refused writes nothing),
            // then at a random moment within a move's time.
            if kill % 4 != 0 {
                _ = try await onOwnThread {
                    Poll.blocking(timeout: 60, every: .milliseconds(1)) {
                        Self.vaultState(broker) != before || ended.withLock { $0 }
                    }
                }
            }
            try await Task.sleep(for: .microseconds(Int.random(in: 0...Int(window * 1_000_000))))
            broker.crash()
            _ = await moving.result
            client.close()

            try await broker.start()
            let check = try broker.client()
            defer { check.close() }
            let status = try await check.status().first { $0.account == "ci" }
            let row = try await server.dump().contains("\nci\t")
            #expect(status != nil, "kill \(kill): the account is served")
            #expect(
                (status?.shared == true) == row,
                "kill \(kill): shared in status \(String(describing: status?.shared)), row \(row)")
            #expect(try await check.token(account: "ci", minTTL: 1).accessToken == Self.token, "kill \(kill)")
            if (status?.shared == true) != shared { tookEffect += 1 }
            shared = status?.shared == true
        }
        let log = broker.log
        #expect(!log.contains("a local account has the name of a shared one"), "never two copies")
        let settled = ["finished sharing an account", "finished unsharing an account"].map {
            log.components(separatedBy: $0).count - 1
        }
        print(
            "fleet move crash test: \(Self.kills) SIGKILLs, 3 in 4 within \(Int(window * 1000)) ms of a move's mark, "
                + "\(tookEffect) moves took effect, settled at restart: \(settled[0]) shares, \(settled[1]) unshares")
    }

    /// The size and modification time of the vault's files: they change with each save.
    private static func vaultState(_ broker: BrokerProcess) -> [Int] {
        [broker.vaultPath, broker.vaultPath + ".log"].flatMap { path in
            var info = stat()
            guard stat(path, &info) == 0 else { return [-1] }
            return [Int(info.st_size), info.st_mtim.tv_sec, info.st_mtim.tv_nsec]
        }
    }

    /// Shares the account when local, unshares it when shared.
    private static func move(_ broker: BrokerProcess, shared: Bool) async throws {
        let client = try broker.client()
        defer { client.close() }
        try await move(client, shared: shared)
    }

    private static func move(_ client: BrokerClient, shared: Bool) async throws {
        _ = try await client.perform(shared ? .unshare(account: "ci") : .share(account: "ci"))
    }
}
