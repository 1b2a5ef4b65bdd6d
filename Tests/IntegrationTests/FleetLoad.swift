import BrokerClient
import BrokerProtocol
import Foundation
import Synchronization
import TestSupport

/// Many clients of a test fleet, each its own connection to one host's broker, asking for a
/// shared account's token in a loop and noting every answer (when it was asked, when answered,
/// what came: a token or an error) under the phase of the test it fell in, for checking against
/// the IdP's own record afterwards. A call stuck for 20 s has its connection closed (noted as
/// stalled), so that a silent broker cannot hold the test.
final class FleetLoad: Sendable {
    /// One answer to one client.
    struct Answer: Sendable {
        enum Outcome: Sendable {
            case token(String, expiresAt: Date)
            case error(BrokerError.Code)
            /// The broker's socket was not there or closed (a host killed).
            case noBroker
            /// No answer within 20 s.
            case stalled
        }

        var host: Int
        var phase: String
        var asked: Date
        var answered: Date
        var outcome: Outcome
    }

    /// One client: its connection, and since when its current call runs.
    private final class Client: Sendable {
        let host: Int
        let socketPath: String
        let connection: Mutex<BrokerClient?> = Mutex(nil)
        let callStarted: Mutex<ContinuousClock.Instant?> = Mutex(nil)
        let stalled = Mutex(false)

        init(host: Int, socketPath: String) {
            self.host = host
            self.socketPath = socketPath
        }

        /// The connection, made again after a failure.
        func live() throws -> BrokerClient {
            if let client = connection.withLock({ $0 }) { return client }
            let client = try BrokerClient(socketPath: socketPath)
            connection.withLock { $0 = client }
            return client
        }

        func drop() {
            connection.withLock { connection in
                connection?.close()
                connection = nil
            }
        }
    }

    private let account: String
    private let clients: [Client]
    private let answers = Mutex<[Answer]>([])
    private let phase = Mutex("load")
    private let running = Mutex(true)
    private let tasks = Mutex<[Task<Void, Never>]>([])

    /// `perHost` clients for each socket of `socketPaths` (host 0, 1, ...).
    init(account: String, socketPaths: [String], perHost: Int) {
        self.account = account
        clients = socketPaths.enumerated().flatMap { host, path in
            (0..<perHost).map { _ in Client(host: host, socketPath: path) }
        }
    }

    /// Starts every client's loop, and the watchdog that closes stalled calls.
    func start() {
        let started = clients.map { client in Task { await self.ask(client) } } + [Task { await self.watch() }]
        tasks.withLock { $0 = started }
    }

    /// Answers from here on are noted under `name`.
    func enter(_ name: String) { phase.withLock { $0 = name } }

    /// Stops every loop and waits for them; closes every connection.
    func stop() async {
        running.withLock { $0 = false }
        for task in tasks.withLock({ $0 }) { await task.value }
        for client in clients { client.drop() }
    }

    /// Every answer so far.
    var all: [Answer] { answers.withLock { $0 } }

    private var isRunning: Bool { running.withLock { $0 } }

    private func ask(_ client: Client) async {
        // Spread out at first, so that the clients do not ask in step; later, a real client's
        // pause between asks to the fleet's brokers.
        var pause = Int.random(in: 0...300)
        while isRunning {
            try? await Task.sleep(for: .milliseconds(pause))
            let asked = Date()
            let outcome: Answer.Outcome
            client.callStarted.withLock { $0 = .now }
            do {
                let token = try await client.live().token(account: account, minTTL: 1)
                outcome = .token(token.accessToken, expiresAt: token.expiresAt)
            } catch let error as BrokerError {
                outcome = .error(error.code)
            } catch {
                let stalled = client.stalled.withLock { stalled in
                    defer { stalled = false }
                    return stalled
                }
                outcome = stalled ? .stalled : .noBroker
                client.drop()
            }
            client.callStarted.withLock { $0 = nil }
            let answer = Answer(
                host: client.host, phase: phase.withLock { $0 }, asked: asked, answered: Date(), outcome: outcome)
            answers.withLock { $0.append(answer) }
            pause = if case .noBroker = outcome { 100 } else { Int.random(in: 150...350) }
        }
    }

    private func watch() async {
        // Until the load stops: a call to the fleet's brokers stalled for 20 s is dropped.
        _ = await eventually(timeout: .infinity) {
            for client in clients {
                guard let started = client.callStarted.withLock({ $0 }), started + .seconds(20) < .now else { continue }
                client.stalled.withLock { $0 = true }
                client.drop()
            }
            return !isRunning
        }
    }
}
