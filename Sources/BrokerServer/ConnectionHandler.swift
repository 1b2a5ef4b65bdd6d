import BrokerCore
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
            dispatcher.decide(line: $0, peer: peer, decoder: decoder, now: dispatcher.broker.clock.now())
        }
        switch decision {
        case .immediate(let bytes):
            context.write(wrapOutboundOut(context.channel.allocator.buffer(bytes: bytes)), promise: nil)
            pendingFlush = true
        case .subscribe(let ack, let id, let events):
            context.write(wrapOutboundOut(context.channel.allocator.buffer(bytes: ack)), promise: nil)
            pendingFlush = true
            forward(events, id: id, to: context.channel)
        case .deferred(let request):
            let channel = context.channel
            let dispatcher = self.dispatcher
            Task {
                let bytes = await dispatcher.run(request)
                channel.writeAndFlush(channel.allocator.buffer(bytes: bytes), promise: nil)
            }
        }
    }

    /// Writes each event as it comes, one write in flight at a time; a subscriber whose buffer
    /// overflowed gets a final `busy` line and is disconnected.
    private func forward(_ events: EventHub.Events, id: RequestID, to channel: any Channel) {
        let dispatcher = self.dispatcher
        let task = Task {
            let encoder = Wire.makeEncoder()
            do {
                for try await event in events {
                    try await channel.writeAndFlush(channel.allocator.buffer(bytes: dispatcher.eventLine(id: id, event, encoder: encoder)))
                }
            } catch is SubscriberTooSlow {
                let line = dispatcher.errorLine(
                    id: id, BrokerError(.busy, "events were not read fast enough; subscribe again", retryAfterMs: 1000))
                try? await channel.writeAndFlush(channel.allocator.buffer(bytes: line))
                try? await channel.close()
            } catch {}
        }
        channel.closeFuture.whenComplete { _ in task.cancel() }
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
