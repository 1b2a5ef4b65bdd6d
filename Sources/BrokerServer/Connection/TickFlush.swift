import NIOCore

/// Flushes, together at the end of an event-loop tick, the answers the connections of one loop
/// wrote inline during that tick's reads.
///
/// A local client that is quicker than the broker sleeps in `epoll_wait` between answers, and
/// each answer flushed as soon as it is written wakes it again: at 64 connections that made
/// one wake-up (an inter-processor interrupt on a virtual machine) per six requests. Flushed
/// together, the answers of a tick reach it as one batch.
final class TickFlush: @unchecked Sendable {
    // Sendable only to be handed from `SocketServer` to its connections' handlers; every
    // method runs on `eventLoop`.
    private let eventLoop: any EventLoop
    private var waiting: [ChannelHandlerContext] = []
    private var spare: [ChannelHandlerContext] = []

    init(eventLoop: any EventLoop) { self.eventLoop = eventLoop }

    /// One flusher for each event loop of `group`, by the loop's identity.
    static func perLoop(of group: any EventLoopGroup) -> [ObjectIdentifier: TickFlush] {
        var flushers: [ObjectIdentifier: TickFlush] = [:]
        for loop in group.makeIterator() { flushers[ObjectIdentifier(loop)] = TickFlush(eventLoop: loop) }
        return flushers
    }

    /// Flushes `context`'s channel once this tick's reads are handled (once per call: a
    /// context passed twice is flushed twice, the second time with nothing to write).
    func flushAfterTick(_ context: ChannelHandlerContext) {
        eventLoop.assertInEventLoop()
        if waiting.isEmpty { eventLoop.assumeIsolated().execute { self.flushAll() } }
        waiting.append(context)
    }

    private func flushAll() {
        swap(&waiting, &spare)
        for context in spare { context.flush() }
        spare.removeAll(keepingCapacity: true)
    }
}
