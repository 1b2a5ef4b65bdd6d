import BrokerProtocol
import Foundation
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

/// The Unix-socket listener, run as a `Service`: accepts connections, admits only the
/// owner's uid and root (`SO_PEERCRED`), and serves JSON lines on each connection.
public final class SocketServer: Service {
    private let address: ListenAddress
    private let dispatcher: RequestDispatcher
    private let policy: AccessPolicy
    private let logger: Logger
    private let group: any EventLoopGroup
    private let onListening: @Sendable () async -> Void

    public init(
        address: ListenAddress, dispatcher: RequestDispatcher, policy: AccessPolicy, logger: Logger,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        onListening: @escaping @Sendable () async -> Void
    ) {
        self.address = address
        self.dispatcher = dispatcher
        self.policy = policy
        self.logger = logger
        self.group = group
        self.onListening = onListening
    }

    public func run() async throws {
        let channel = try await bind()
        await onListening()
        await withGracefulShutdownHandler {
            try? await channel.closeFuture.get()
        } onGracefulShutdown: {
            channel.close(promise: nil)
        }
        if case .path(let path) = address { unlink(path) }
    }

    private func bind() async throws -> any Channel {
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .childChannelInitializer { [dispatcher, policy, logger] channel in
                Self.admit(channel, dispatcher: dispatcher, policy: policy, logger: logger)
            }
        switch address {
        case .inherited(let descriptor, let path):
            logger.info("adopted the socket from systemd", metadata: ["socket": "\(path)"])
            return try await bootstrap.withBoundSocket(descriptor).get()
        case .path(let path):
            try SocketDirectory.prepare(path)
            let previous = umask(0o177)
            defer { umask(previous) }
            let channel = try await bootstrap.bind(unixDomainSocketPath: path).get()
            chmod(path, 0o600)
            logger.info("listening", metadata: ["socket": "\(path)"])
            return channel
        }
    }

    private static func admit(
        _ channel: any Channel, dispatcher: RequestDispatcher, policy: AccessPolicy, logger: Logger
    ) -> EventLoopFuture<Void> {
        guard let provider = channel as? any SocketOptionProvider else {
            return channel.eventLoop.makeFailedFuture(ServerError(description: "no peer credentials"))
        }
        let credentials: EventLoopFuture<PeerCredentials> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
        return credentials.flatMap { credentials in
            let peer = PeerIdentity(pid: credentials.pid, uid: credentials.uid, gid: credentials.gid)
            return channel.eventLoop.makeCompletedFuture {
                guard policy.mayConnect(peer) else {
                    logger.warning("refused a connection from another user", metadata: ["peer": "\(peer)"])
                    let line = dispatcher.errorLine(
                        id: nil, BrokerError(.forbidden, "this broker serves only uid \(policy.ownerUID)"))
                    try channel.pipeline.syncOperations.addHandler(RefusingHandler(line: line))
                    return
                }
                try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(LineFrameDecoder()))
                try channel.pipeline.syncOperations.addHandler(
                    ConnectionHandler(dispatcher: dispatcher, peer: peer, logger: logger))
            }
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

/// The kernel's `struct ucred` (pid, uid, gid), which Swift's Glibc module does not export.
struct PeerCredentials: Sendable {
    var pid: Int32
    var uid: UInt32
    var gid: UInt32
}
