import BrokerProtocol
import Foundation
import Logging
import NIOCore

/// One client connection: answers cached tokens and errors inline on the event loop, hands
/// everything else to the broker, and writes answers back in whatever order they finish.
final class ConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let dispatcher: RequestDispatcher
    private let peer: PeerIdentity
    private let logger: Logger
    private let decoder = Wire.makeDecoder()
    private var pendingFlush = false

    init(dispatcher: RequestDispatcher, peer: PeerIdentity, logger: Logger) {
        self.dispatcher = dispatcher
        self.peer = peer
        self.logger = logger
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let line = unwrapInboundIn(data)
        let decision = line.withUnsafeReadableBytes {
            dispatcher.decide(line: $0, peer: peer, decoder: decoder, now: Date())
        }
        switch decision {
        case .immediate(let bytes):
            context.write(wrapOutboundOut(context.channel.allocator.buffer(bytes: bytes)), promise: nil)
            pendingFlush = true
        case .deferred(let request):
            let channel = context.channel
            let dispatcher = self.dispatcher
            Task {
                let bytes = await dispatcher.run(request)
                channel.writeAndFlush(channel.allocator.buffer(bytes: bytes), promise: nil)
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if pendingFlush {
            pendingFlush = false
            context.flush()
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if error is LineTooLongError {
            let line = dispatcher.errorLine(
                id: nil, BrokerError(.lineTooLong, "a request line may be at most \(maximumLineLength) bytes"))
            let channel = context.channel
            channel.writeAndFlush(channel.allocator.buffer(bytes: line)).whenComplete { _ in
                channel.close(promise: nil)
            }
            logger.notice("closed a connection that sent an oversized line", metadata: ["peer": "\(peer)"])
        } else {
            context.close(promise: nil)
        }
    }
}
