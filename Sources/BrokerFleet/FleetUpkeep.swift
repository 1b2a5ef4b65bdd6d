import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Logging
import ServiceLifecycle

/// Keeps a broker in its fleet while brokerd runs: makes or checks the schema if the database
/// did not answer at start (every 5 seconds until it does), then once a lease period notes this
/// host and calls `sync` (which serves shared accounts added by other hosts and takes their
/// commits); meanwhile it listens for the other brokers' notifications and hands each to
/// `notice`, calling `sync` again whenever it starts listening anew (a notification may have
/// been missed). A fleet key that turns out to be another fleet's ends brokerd, having written
/// nothing.
public struct FleetUpkeep: Service {
    public let connection: FleetConnection
    public let prepared: Bool
    let logger: Logger
    let sync: @Sendable () async -> Void
    let notice: @Sendable (FleetNotice) async -> Void

    public init(
        connection: FleetConnection, prepared: Bool, logger: Logger, sync: @escaping @Sendable () async -> Void,
        notice: @escaping @Sendable (FleetNotice) async -> Void
    ) {
        self.connection = connection
        self.prepared = prepared
        self.logger = logger
        self.sync = sync
        self.notice = notice
    }

    public func run() async throws {
        try await cancelWhenGracefulShutdown {
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await keep() }
                group.addTask { await listen() }
            }
        }
    }

    /// Listens while brokerd runs; a listening connection that ends is opened again once the
    /// database answers (`FleetConnection.reconnect`), after a pause that doubles, up to 10 s,
    /// each time one ends within 10 s of its start.
    private func listen() async {
        var listened = false
        var pause = Duration.zero
        while !Task.isCancelled {
            if listened { await sync() }
            listened = true
            let started = ContinuousClock.now
            do {
                try await connection.listen(notice)
            } catch {
                logger.debug("the fleet's notifications stopped", metadata: ["reason": "\(error)"])
            }
            let quick = started.duration(to: .now) < .seconds(10)
            pause = quick ? min(max(pause * 2, .milliseconds(500)), .seconds(10)) : .zero
            guard await connection.reconnect(after: pause) else { return }
        }
    }

    private func keep() async throws {
        var prepared = self.prepared
        while !Task.isCancelled {
            if !prepared {
                prepared = try await connection.prepare(within: .seconds(10))
                if prepared { logger.notice("the fleet's database answers; shared accounts are served") }
            } else {
                do {
                    try await connection.store.noteHost()
                } catch {
                    logger.warning("the fleet's database does not answer", metadata: ["reason": "\(error)"])
                }
            }
            if prepared { await sync() }
            do {
                try await EventLoopSleep.sleep(for: prepared ? .seconds(connection.settings.leaseSeconds) : .seconds(5))
            } catch {
                return
            }
        }
    }
}
