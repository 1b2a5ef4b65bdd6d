import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#endif

/// Where the server listens.
public enum ListenAddress: Sendable {
    /// Bind this path (directory 0700, socket 0600), replacing a stale socket file.
    case path(String)
    /// Adopt a listening socket inherited from systemd; `path` is only for messages.
    case inherited(descriptor: Int32, path: String)
}

/// A socket-server error with a message for people.
public struct ServerError: Error, CustomStringConvertible {
    public let description: String
}

/// The Unix-socket listener, run as a `Service`: accepts connections, admits the uids the
/// policy lets in (`SO_PEERCRED`) within `ConnectionLimits`, attests each caller once
/// (`CallerAttestor`), and serves JSON lines on each connection in a task of its own, all
/// children of `run()`.
public final class SocketServer: Service {
    private let address: ListenAddress
    private let dispatcher: RequestDispatcher
    private let policy: AccessPolicy
    private let quota: ConnectionQuota
    private let limitLog: LimitLog
    private let logger: Logger
    private let group: any EventLoopGroup
    private let tickFlushes: [ObjectIdentifier: TickFlush]
    private let onListening: @Sendable () async -> Void

    public init(
        address: ListenAddress, dispatcher: RequestDispatcher, policy: AccessPolicy, logger: Logger,
        limits: ConnectionLimits = .standard(settings: BrokerSettings()),
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        onListening: @escaping @Sendable () async -> Void
    ) {
        self.address = address
        self.dispatcher = dispatcher
        self.policy = policy
        self.quota = ConnectionQuota(limits: limits)
        self.limitLog = LimitLog(logger: logger)
        self.logger = logger
        self.group = group
        self.tickFlushes = TickFlush.perLoop(of: group)
        self.onListening = onListening
    }

    /// Serves until graceful shutdown: then accepts no more, lets every connection answer its
    /// running requests (`ConnectionLimits.drainTimeout`), and returns when all have closed.
    public func run() async throws {
        let server = try await bind()
        await onListening()
        defer { if case .path(let path) = address { unlink(path) } }
        let retryAfterMs = quota.limits.retryAfterMs
        try await withGracefulShutdownHandler {
            try await withThrowingDiscardingTaskGroup { connections in
                try await server.executeThenClose { accepted in
                    for try await admission in accepted {
                        guard case .admitted(let connection, let caller) = admission else { continue }
                        connections.addTask { [dispatcher] in
                            await ConnectionSession.run(
                                connection, caller: caller, dispatcher: dispatcher, retryAfterMs: retryAfterMs)
                        }
                    }
                }
            }
        } onGracefulShutdown: {
            server.channel.close(promise: nil)
        }
    }

    /// What became of one accepted connection.
    enum Admission: Sendable {
        case admitted(NIOAsyncChannel<ConnectionWork, ConnectionReply>, Caller)
        /// Told why (`forbidden` or `busy`) and closed.
        case refused
    }

    private func bind() async throws -> NIOAsyncChannel<Admission, Never> {
        let limits = quota.limits
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .childChannelOption(.maxMessagesPerRead, value: 1)
            .childChannelOption(
                .recvAllocator,
                value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 1024, maximum: limits.readBufferLimit)
            )
            .childChannelOption(
                .writeBufferWaterMark,
                value: .init(low: limits.writeBufferLowWater, high: limits.writeBufferHighWater))
        // Accepted connections waiting for the accept loop; NIO's default of 10 makes the listener
        // pause and resume many times over in a burst of local clients.
        let acceptBuffer = NIOAsyncSequenceProducerBackPressureStrategies.HighLowWatermark(
            lowWatermark: 64, highWatermark: 256)
        let initializer: @Sendable (any Channel) -> EventLoopFuture<Admission> = {
            [dispatcher, policy, quota, limitLog, logger, tickFlushes] channel in
            let tickFlush = tickFlushes[ObjectIdentifier(channel.eventLoop)] ?? TickFlush(eventLoop: channel.eventLoop)
            return Self.admit(
                channel, dispatcher: dispatcher, policy: policy, quota: quota, limitLog: limitLog, logger: logger,
                tickFlush: tickFlush)
        }
        switch address {
        case .inherited(let descriptor, let path):
            logger.info("adopted the socket from systemd", metadata: ["socket": "\(path)"])
            let rules = policy.rules.current
            if rules.socketGroup != nil || rules.socketMode != AccessRules().socketMode {
                logger.notice(
                    """
                    broker.socket_group and broker.socket_mode apply only to a socket brokerd binds itself; \
                    set SocketGroup= and SocketMode= in a drop-in for the socket unit
                    """)
            }
            return try await bootstrap.bind(
                descriptor, serverBackPressureStrategy: acceptBuffer, childChannelInitializer: initializer)
        case .path(let path):
            try SocketDirectory.prepare(path)
            // bind(2) creates the socket 0600 under this umask. No chmod afterwards: the socket
            // already accepts then, so a late chmod would race whoever set its mode since.
            let previous = umask(0o177)
            defer { umask(previous) }
            let channel = try await bootstrap.bind(
                unixDomainSocketPath: path, serverBackPressureStrategy: acceptBuffer,
                childChannelInitializer: initializer)
            do {
                try SocketSharing.share(path, rules: policy.rules.current)
            } catch {
                try? await channel.channel.close()
                throw error
            }
            logger.info("listening", metadata: ["socket": "\(path)"])
            return channel
        }
    }

    /// Reads the peer's credentials and admits it if its uid may connect and it is within the
    /// connection limits; otherwise it gets one line saying why and is closed. An admitted
    /// peer is attested (`CallerAttestor`); `/proc` is read only when a rule needs it.
    private static func admit(
        _ channel: any Channel, dispatcher: RequestDispatcher, policy: AccessPolicy, quota: ConnectionQuota,
        limitLog: LimitLog, logger: Logger, tickFlush: TickFlush
    ) -> EventLoopFuture<Admission> {
        guard let provider = channel as? any SocketOptionProvider else {
            channel.close(promise: nil)
            return channel.eventLoop.makeSucceededFuture(.refused)
        }
        let credentials: EventLoopFuture<PeerCredentials> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
        return credentials.flatMap { credentials in
            // A kernel before 6.5 has no SO_PEERPIDFD: the attestor then works from the pid alone.
            let pidfd: EventLoopFuture<Int32> = provider.unsafeGetSocketOption(
                level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(CallerAttestor.peerPIDFDOption))
            return pidfd.map { Optional($0) }.recover { _ in nil }.map { (credentials, $0) }
        }.flatMapThrowing { credentials, pidfd -> Admission in
            let peer = PeerIdentity(pid: credentials.pid, uid: credentials.uid, gid: credentials.gid)
            guard policy.mayConnect(peer) else {
                if let pidfd { close(pidfd) }
                limitLog.notice(
                    "refused a connection from another user", key: "uid \(peer.uid)", metadata: ["peer": "\(peer)"])
                let line = dispatcher.errorLine(
                    id: nil, BrokerError(.forbidden, "this broker serves only uid \(policy.ownerUID)"))
                try channel.pipeline.syncOperations.addHandler(RefusingHandler(line: line))
                return .refused
            }
            let caller = policy.attestor.attest(peer, pidfd: pidfd, reading: policy.rules.judgesPrograms)
            if let reason = quota.reserveConnection(uid: peer.uid) {
                limitLog.hit("connections", peer: peer)
                let line = dispatcher.errorLine(
                    id: nil, BrokerError(.busy, reason, retryAfterMs: quota.limits.retryAfterMs))
                try channel.pipeline.syncOperations.addHandler(RefusingHandler(line: line))
                return .refused
            }
            let handler = ConnectionHandler(
                dispatcher: dispatcher, access: CallerAccess(policy: policy, caller: caller),
                quota: quota, limitLog: limitLog, logger: logger, tickFlush: tickFlush)
            do {
                try channel.pipeline.syncOperations.addHandler(handler)
            } catch {
                quota.releaseConnection(uid: peer.uid, requests: 0, subscriptions: 0, budgetBytes: 0)
                throw error
            }
            return .admitted(try NIOAsyncChannel(wrappingChannelSynchronously: channel), caller)
        }.flatMapError { _ in
            channel.close(promise: nil)
            return channel.eventLoop.makeSucceededFuture(.refused)
        }
    }
}

/// Answers a refused peer with one error line as soon as the connection is active, then closes it.
final class RefusingHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let line: [UInt8]

    init(line: [UInt8]) { self.line = line }

    func channelActive(context: ChannelHandlerContext) {
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(bytes: line))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}
