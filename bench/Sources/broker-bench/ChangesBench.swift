import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Foundation
import TestSupport

/// `broker-bench changes`: `add`, `set_tokens` and `remove` of one account, timed over the socket
/// on a brokerd holding 100, 1,000 and 10,000 static accounts (800-byte tokens), its
/// notification socket drained as the service manager drains it (each change sends a
/// `STATUS=`): a change to one account should cost the same however many there are. Each size
/// starts from a vault written beforehand, so that filling it is not what the run times.
enum ChangesBench {
    static let sizes = [100, 1000, 10_000]
    /// Rounds of one `set_tokens`, one `add` and the `remove` of the added account, per size.
    static let rounds = 300
    /// Rounds run before those timed.
    static let warmup = 20

    static func run(brokerd: String) async throws {
        for size in sizes {
            let broker = try BrokerProcess(brokerd: brokerd)
            try writeVault(of: broker, accounts: size)
            let notify = try DatagramListener(path: broker.root.appendingPathComponent("notify.sock").path)
            try await broker.startWithNotifySocket(notify.path)
            defer { broker.stop() }
            var ready = false
            while !ready {
                guard let message = notify.receive(timeout: 60) else { throw BenchError("no READY=1 from brokerd") }
                ready = message.contains("READY=1")
            }
            let connection = try RawConnection(path: broker.socketPath, waitingUpTo: 10)
            var times: [String: [Double]] = [:]
            for round in 0..<(warmup + rounds) {
                let account = "bench-\(round * 7919 % size)"
                let added = "bench-added-\(round)"
                for (operation, line) in [
                    ("set_tokens", #"{"id":1,"op":"set_tokens","account":"\#(account)","tokens":\#(tokens(round))}"#),
                    (
                        "add",
                        #"{"id":2,"op":"add","account":"\#(added)","provider":{"kind":"static"},"tokens":\#(tokens(round))}"#
                    ),
                    ("remove", #"{"id":3,"op":"remove","account":"\#(added)"}"#),
                ] {
                    let start = Monotonic.now()
                    let answer = connection.request(line)
                    let elapsed = Monotonic.now() - start
                    guard answer?.contains(#""ok":true"#) == true else {
                        throw BenchError("\(operation) with \(size) accounts failed: \(answer ?? "no answer")")
                    }
                    if round >= warmup { times[operation, default: []].append(elapsed * 1000) }
                }
                while notify.receiveQueued() != nil {}
            }
            var figures: [String] = []
            for operation in ["add", "set_tokens", "remove"] {
                let sorted = (times[operation] ?? []).sorted()
                guard !sorted.isEmpty else { continue }
                let (p50, p99) = (sorted[sorted.count / 2], sorted[sorted.count * 99 / 100])
                note("\(operation), \(size) accounts: p50 \(format(p50)) ms, p99 \(format(p99)) ms")
                figures.append("\(operation)_\(size)_p50_ms=\(format(p50)) \(operation)_\(size)_p99_ms=\(format(p99))")
            }
            print(figures.joined(separator: " "))
        }
    }

    /// Writes a vault of `accounts` static accounts `bench-N` (`VaultSaveBench.record`: a pushed
    /// token valid for years), as `add` would have left them, with the key file brokerd reads.
    static func writeVault(of broker: BrokerProcess, accounts: Int) throws {
        try FileManager.default.createDirectory(at: broker.configDirectory, withIntermediateDirectories: true)
        let vault = try Vault(path: broker.vaultPath, key: VaultKey.load(path: broker.keyPath, create: true))
        try vault.save(VaultContents(accounts: try (0..<accounts).map { try VaultSaveBench.record($0, version: 0) }))
    }

    /// A `tokens` object with an 800-byte access token valid for a day.
    static func tokens(_ round: Int) -> String {
        let prefix = "bench-token-\(round)-"
        return
            #"{"access_token":"\#(prefix + String(repeating: "x", count: 800 - prefix.utf8.count))","expires_in":86400}"#
    }

    static func format(_ milliseconds: Double) -> String { String(format: "%.3f", milliseconds) }

    static func note(_ text: String) {
        FileHandle.standardError.write(Data("[changes] \(text)\n".utf8))
    }
}
