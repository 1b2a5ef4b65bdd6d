import ArgumentParser
import BrokerEngine
import BrokerFleet
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerServer
import BrokerSystemd
import BrokerVault
import CWipeOnFree
import FoundationEssentials
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import UnixSignals

/// brokerd: the per-user token broker daemon. Wiring only; the work lives in the modules.
@main
struct Brokerd: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "brokerd", abstract: "Keep OAuth tokens fresh and hand them to local programs over a Unix socket.",
        version: Release.version)

    @Option(help: "Socket path (default: $TOKENBROKER_SOCKET or $XDG_RUNTIME_DIR/tokenbroker/broker.sock).")
    var socket: String?

    @Option(help: "Config file (default: $XDG_CONFIG_HOME/tokenbroker/broker.toml).")
    var config: String?

    @Option(help: "Vault file (default: $XDG_STATE_HOME/tokenbroker/vault).")
    var vault: String?

    @Option(
        help: "Vault key file (default: $CREDENTIALS_DIRECTORY/vault-key or $XDG_CONFIG_HOME/tokenbroker/vault.key).")
    var keyFile: String?

    @Flag(
        help: """
            Derive the vault key from a passphrase (Argon2id) instead of a key file, as [broker] key = "passphrase" \
            does: brokerd starts locked until brokerctl unlock.
            """)
    var passphrase = false
    @Option(help: "Least severe level logged: trace, debug, info, ... (default: $TOKENBROKER_LOG_LEVEL or info).")
    var logLevel: String?

    /// Runs brokerd's tasks on NIO's event loops, the main thread waiting for them: no Swift
    /// concurrency job may run before `EventLoops.takeOver()`, hence no async `main`.
    func run() throws {
        let environment = ProcessInfo.processInfo.environment
        let loops = Result { try EventLoops.count(environment: environment) }
        let onLoops = EventLoops.takeOver(count: (try? loops.get()) ?? EventLoops.standard)
        try MultiThreadedEventLoopGroup.singleton.any().makeFutureWithTask {
            try await self.start(environment: environment, loops: loops, onLoops: onLoops)
        }.wait()
    }

    private func start(environment: [String: String], loops: Result<Int, any Error>, onLoops: Bool) async throws {
        let level = Result { try LogLevel.level(option: logLevel, environment: environment) }
        LoggingSystem.bootstrap { label in
            var handler = JournalLogHandler(label: label)
            handler.logLevel = (try? level.get()) ?? LogLevel.standard
            return handler
        }
        let logger = Logger(label: "brokerd")
        ProcessHardening.apply()
        // Keeps the wipe-on-free allocator linked in: every freed heap block is zeroed.
        precondition(tokenbroker_wipe_on_free() == 1)
        tokenbroker_keep_heap_trimmed()
        do {
            _ = try level.get()
            _ = try loops.get()
            if !onLoops {
                logger.warning("Swift concurrency runs on libdispatch: an idle brokerd wakes once a second")
            }
            try await serve(logger: logger)
        } catch {
            logger.critical("brokerd cannot start: \(error)")
            throw ExitCode.failure
        }
    }

    private func serve(logger: Logger) async throws {
        let paths = DefaultPaths()
        let configPath = config ?? paths.config
        let configuration = try ConfigFile.load(path: configPath)
        let key = keyFile.map { (path: $0, fromSystemd: false) } ?? paths.keyFile
        let vault = try Vault(
            path: self.vault ?? paths.vault, keyFile: KeyFile(path: key.path, isCredential: key.fromSystemd))
        let configured = passphrase ? VaultKeyMode.passphrase : configuration.vaultKey
        if try vault.prepareKey(configured: configured) != configured {
            logger.notice(
                "the vault is sealed with a passphrase; starting locked (set key = \"passphrase\" in broker.toml)")
        }
        let connection = try await connectFleet(configuration.fleet, logger: logger)
        let http = IdPClient(settings: configuration.settings)
        do {
            let broker = try Broker(
                vault: vault, settings: configuration.settings, http: http, logger: logger, configPath: configPath)
            let fleet = connection.map { connection, prepared in
                FleetUpkeep(
                    connection: connection, prepared: prepared, logger: logger,
                    sync: { await broker.joinFleet(connection.store, leaseSeconds: connection.settings.leaseSeconds) },
                    notice: { await broker.fleetNotice($0) })
            }
            do {
                try await broker.configure(configuration)
            } catch {
                throw BrokerError(error)
            }
            if let (connection, prepared) = connection, prepared {
                await broker.joinFleet(connection.store, leaseSeconds: connection.settings.leaseSeconds)
            }
            try await serve(broker: broker, fleet: fleet, logger: logger)
        } catch {
            await http.shutdown()
            await connection?.0.close()
            throw error
        }
        await http.shutdown()
        await connection?.0.close()
    }

    /// Connects to the fleet's database when `[fleet]` is set, and makes or checks its schema
    /// before any client is served; a database that does not answer yet is waited for by
    /// `FleetUpkeep`. Another fleet's key stops brokerd here, before anything is written.
    private func connectFleet(_ settings: FleetSettings?, logger: Logger) async throws -> (FleetConnection, Bool)? {
        guard let settings else { return nil }
        let credentials = try FleetCredentials(settings: settings, environment: ProcessInfo.processInfo.environment)
        let connection = try FleetConnection(settings: settings, credentials: credentials, logger: logger)
        do {
            let prepared = try await connection.prepare(within: .seconds(10))
            if prepared {
                logger.info("joined the fleet", metadata: ["host": "\(settings.host)"])
            } else {
                logger.warning("the fleet's database does not answer; brokerd keeps trying")
            }
            return (connection, prepared)
        } catch {
            await connection.close()
            throw error
        }
    }

    private func serve(broker: Broker, fleet: FleetUpkeep?, logger: Logger) async throws {
        let notifier = SystemdNotifier()
        let socketPath = socket ?? DefaultPaths().socket
        let address: ListenAddress =
            notifier.inheritedSocket().map { .inherited(descriptor: $0, path: socketPath) } ?? .path(socketPath)
        let policy = AccessPolicy(rules: broker.accessRules, logger: logger)
        let server = SocketServer(
            address: address, dispatcher: RequestDispatcher(broker: broker, policy: policy, logger: logger),
            policy: policy, logger: logger, limits: .standard(settings: broker.settings)
        ) {
            let summary = await broker.summary()
            notifier.ready(status: summary)
            logger.info("ready", metadata: ["status": "\(summary)"])
        }
        let scheduler = RefreshScheduler(broker: broker)
        let statusChange = WakeSignal()
        broker.changes.subscribe(statusChange)
        let lifecycle = SystemdLifecycle(
            notifier: notifier, summary: { await broker.summary() }, changed: { await statusChange.wait() }
        ) {
            scheduler.isResponsive(within: .seconds(5))
        } sleep: {
            try await EventLoopSleep.sleep(until: $0)
        }
        let reloader = ReloadOnHangup(notifier: notifier) { _ = try? await broker.reloadConfiguration() }
        let notices = NeedsLoginNotices(
            broker: broker, notifications: DesktopNotifications(environment: ProcessInfo.processInfo.environment),
            logger: logger)
        let group = ServiceGroup(
            configuration: .init(
                services: [
                    .init(service: server), .init(service: scheduler), .init(service: reloader),
                    .init(service: lifecycle), .init(service: notices),
                ] + (fleet.map { [.init(service: $0)] } ?? []),
                gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
        await broker.drain()
        // STOPPING=1 reaches the manager before the process ends, unless it does not read.
        notifier.flush(timeout: .milliseconds(300))
        logger.info("stopped")
    }
}
