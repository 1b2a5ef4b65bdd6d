import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO
import Synchronization

/// A broker's link to its fleet's database: a PostgreSQL client on brokerd's event loops,
/// running from `init` to `close` (replaced by a fresh one after an outage, `reconnect`), and
/// the shared store on it.
public final class FleetConnection: Sendable {
    public let store: PostgresFleetStore
    public let settings: FleetSettings
    private let configuration: PostgresClient.Configuration
    /// A single connection's settings, for the probe of `reconnect`.
    private let probe: PostgresConnection.Configuration
    private let logger: Logger
    /// The run of every client not stopped yet, by client.
    private let running = Mutex<[ObjectIdentifier: Task<Void, Never>]>([:])

    public init(settings: FleetSettings, credentials: FleetCredentials, logger: Logger) throws {
        self.settings = settings
        self.logger = logger
        let tls: PostgresClient.Configuration.TLS
        let probeTLS: PostgresConnection.Configuration.TLS
        switch settings.transport {
        case .plain:
            tls = .disable
            probeTLS = .disable
        case .tls(let caFile):
            var configuration = TLSConfiguration.makeClientConfiguration()
            configuration.certificateVerification = .fullVerification
            configuration.minimumTLSVersion = .tlsv12
            if let caFile { configuration.trustRoots = .file(caFile) }
            tls = .require(configuration)
            probeTLS = .require(try NIOSSLContext(configuration: configuration))
        }
        var configuration = PostgresClient.Configuration(
            host: settings.databaseHost, port: settings.databasePort, username: settings.databaseUser,
            password: credentials.password, database: settings.databaseName, tls: tls)
        // A call waits for the database a third of a lease at most (at least one IdP timeout,
        // since the lease is at least three), and never more than 10 s.
        let milliseconds = Int64(min(10, max(1, settings.leaseSeconds / 3)) * 1000)
        let deadline = Duration.milliseconds(milliseconds)
        configuration.options.connectTimeout = .seconds(5)
        // A statement (or a lock it waits for) that takes longer than a call's deadline ends in an
        // error, so that a stalled database or another broker's stuck transaction cannot hold
        // brokerd, and a call given up on (`FleetDeadline`) cannot take effect much later.
        configuration.options.additionalStartupParameters = [
            ("statement_timeout", "\(milliseconds)ms"), ("lock_timeout", "\(milliseconds)ms"),
        ]
        // One of them listens for the other brokers' notifications.
        configuration.options.maximumConnections = 5
        self.configuration = configuration
        var probe = PostgresConnection.Configuration(
            host: settings.databaseHost, port: settings.databasePort, username: settings.databaseUser,
            password: credentials.password, database: settings.databaseName, tls: probeTLS)
        probe.options.connectTimeout = .seconds(2)
        self.probe = probe
        store = PostgresFleetStore(
            client: Self.start(configuration, logger: logger, in: running), key: credentials.key,
            host: settings.host, logger: logger, deadline: deadline)
    }

    /// A new client on `configuration`, its run kept in `running`.
    private static func start(
        _ configuration: PostgresClient.Configuration, logger: Logger,
        in running: borrowing Mutex<[ObjectIdentifier: Task<Void, Never>]>
    ) -> PostgresClient {
        let client = PostgresClient(
            configuration: configuration, eventLoopGroup: MultiThreadedEventLoopGroup.singleton,
            backgroundLogger: logger)
        running.withLock { $0[ObjectIdentifier(client)] = Task { await client.run() } }
        return client
    }

    /// Hands every notification of another broker (`FleetNotice`) to `handle` until the
    /// listening connection ends (it throws then) or the task is cancelled.
    public func listen(_ handle: @escaping @Sendable (FleetNotice) async -> Void) async throws {
        let store = store
        try await store.currentClient.withConnection { connection in
            try await connection.listen(on: PostgresFleetStore.channel) { notifications in
                for try await notification in notifications {
                    if let notice = store.notice(notification.payload) { await handle(notice) }
                }
            }
        }
    }

    /// After the listening connection ended: waits `pause`, then until the database takes a
    /// login and a query again (tried every 0.5 s), then sends every later call through a fresh
    /// client. postgres-nio's pool waits out a backoff that grows with each failed attempt, to a
    /// minute, so after a long outage the old client could come back that long after the
    /// database did, past a lease. The old client is stopped once the calls it still runs have
    /// had their deadline. Returns `false` when cancelled.
    public func reconnect(after pause: Duration) async -> Bool {
        guard (try? await EventLoopSleep.sleep(for: pause)) != nil else { return false }
        while await !databaseAnswers() {
            guard (try? await EventLoopSleep.sleep(for: .milliseconds(500))) != nil else { return false }
        }
        let old = store.replaceClient(with: Self.start(configuration, logger: logger, in: running))
        Task {
            try? await EventLoopSleep.sleep(for: store.callDeadline)
            running.withLock { $0.removeValue(forKey: ObjectIdentifier(old)) }?.cancel()
        }
        return true
    }

    /// Whether the database takes a login and answers a query now, on a connection of its own,
    /// within 5 s (a probe given up on closes its connection when it ends).
    private func databaseAnswers() async -> Bool {
        let (probe, logger) = (probe, logger)
        let answered = try? await FleetDeadline.run(within: .seconds(5)) {
            let connection = try await PostgresConnection.connect(
                on: MultiThreadedEventLoopGroup.singleton.next(), configuration: probe, id: 0, logger: logger
            ).get()
            let answered = (try? await connection.query("SELECT 1", logger: logger)) != nil
            try? await connection.close()
            return answered
        }
        return answered == true
    }

    /// Makes or checks the schema (`PostgresFleetStore.prepare`) within `timeout`: `false` when
    /// the database did not answer by then. Throws when the fleet key is another fleet's, or
    /// the schema newer than this brokerd's: nothing was written.
    public func prepare(within timeout: Duration) async throws -> Bool {
        try await withThrowingTaskGroup(of: Bool.self) { group in
            group.addTask {
                try await self.store.prepare()
                try await self.store.noteHost()
                return true
            }
            group.addTask {
                try await EventLoopSleep.sleep(for: timeout)
                return false
            }
            defer { group.cancelAll() }
            do {
                return try await group.next() ?? false
            } catch let error as FleetError {
                throw error
            } catch {
                return false
            }
        }
    }

    /// Stops every client and waits for them.
    public func close() async {
        let runs = running.withLock { runs in
            defer { runs = [:] }
            return runs
        }
        for run in runs.values {
            run.cancel()
            await run.value
        }
    }
}
