import BrokerCore
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO

/// A broker's link to its fleet's database: a PostgreSQL client on brokerd's event loops,
/// running from `init` to `close`, and the shared store on it.
public final class FleetConnection: Sendable {
    public let store: PostgresFleetStore
    public let settings: FleetSettings
    private let client: PostgresClient
    private let running: Task<Void, Never>

    public init(settings: FleetSettings, credentials: FleetCredentials, logger: Logger) throws {
        self.settings = settings
        let tls: PostgresClient.Configuration.TLS
        switch settings.transport {
        case .plain: tls = .disable
        case .tls(let caFile):
            var configuration = TLSConfiguration.makeClientConfiguration()
            configuration.certificateVerification = .fullVerification
            configuration.minimumTLSVersion = .tlsv12
            if let caFile { configuration.trustRoots = .file(caFile) }
            tls = .require(configuration)
        }
        var configuration = PostgresClient.Configuration(
            host: settings.databaseHost, port: settings.databasePort, username: settings.databaseUser,
            password: credentials.password, database: settings.databaseName, tls: tls)
        configuration.options.connectTimeout = .seconds(5)
        // A statement (or a lock it waits for) that takes longer ends in an error, so that a
        // stalled database or another broker's stuck transaction cannot hold brokerd.
        configuration.options.additionalStartupParameters = [("statement_timeout", "10s"), ("lock_timeout", "10s")]
        // One of them listens for the other brokers' notifications.
        configuration.options.maximumConnections = 5
        let client = PostgresClient(
            configuration: configuration, eventLoopGroup: MultiThreadedEventLoopGroup.singleton,
            backgroundLogger: logger)
        self.client = client
        running = Task { await client.run() }
        // A call waits for the database a third of a lease at most (at least one IdP timeout,
        // since the lease is at least three), and never more than 10 s.
        let deadline = Duration.milliseconds(Int64(min(10, max(1, settings.leaseSeconds / 3)) * 1000))
        store = PostgresFleetStore(
            client: client, key: credentials.key, host: settings.host, logger: logger, deadline: deadline)
    }

    /// Hands every notification of another broker (`FleetNotice`) to `handle` until the
    /// listening connection ends (it throws then) or the task is cancelled.
    public func listen(_ handle: @escaping @Sendable (FleetNotice) async -> Void) async throws {
        let store = store
        try await client.withConnection { connection in
            try await connection.listen(on: PostgresFleetStore.channel) { notifications in
                for try await notification in notifications {
                    if let notice = store.notice(notification.payload) { await handle(notice) }
                }
            }
        }
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

    /// Stops the client and waits for it.
    public func close() async {
        running.cancel()
        await running.value
    }
}
