import NIOCore
import NIOEmbedded
import Testing

@testable import BrokerServer

/// `TickFlush` on one embedded loop: the connections passed to it during a tick are flushed
/// together when the loop runs its tasks, not before, and every tick after that as well.
@Suite struct TickFlushTests {
    /// Keeps its context so the test can write on the channel as a handler would.
    final class ContextKeeper: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        var context: ChannelHandlerContext?
        func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    }

    let loop = EmbeddedEventLoop()

    /// A channel on the shared loop and its handler's context.
    func connection() throws -> (EmbeddedChannel, ChannelHandlerContext) {
        let keeper = ContextKeeper()
        let channel = EmbeddedChannel(handler: keeper, loop: loop)
        return (channel, try #require(keeper.context))
    }

    func write(_ text: String, on context: ChannelHandlerContext) {
        context.write(NIOAny(ByteBuffer(string: text)), promise: nil)
    }

    /// Writes `text` on `context` as an inline answer and hands the context to `flush`.
    func answer(_ text: String, on context: ChannelHandlerContext, flushedBy flush: TickFlush) {
        write(text, on: context)
        flush.flushAfterTick(context)
    }

    func flushed(_ channel: EmbeddedChannel) throws -> [String] {
        var texts: [String] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { texts.append(String(buffer: buffer)) }
        return texts
    }

    @Test func flushesEveryConnectionOfTheTickWhenTheLoopRunsItsTasks() throws {
        let flush = TickFlush(eventLoop: loop)
        let (first, firstContext) = try connection()
        let (second, secondContext) = try connection()
        answer("a\n", on: firstContext, flushedBy: flush)
        answer("b\n", on: secondContext, flushedBy: flush)
        write("c\n", on: firstContext)
        #expect(try flushed(first).isEmpty)
        #expect(try flushed(second).isEmpty)

        loop.run()
        #expect(try flushed(first) == ["a\n", "c\n"])
        #expect(try flushed(second) == ["b\n"])

        answer("d\n", on: secondContext, flushedBy: flush)
        #expect(try flushed(second).isEmpty)
        loop.run()
        #expect(try flushed(second) == ["d\n"])
        #expect(try flushed(first).isEmpty)
        _ = try first.finish()
        _ = try second.finish()
    }

    @Test func aConnectionClosedBeforeTheEndOfTheTickIsLeftAlone() throws {
        let flush = TickFlush(eventLoop: loop)
        let (closing, closingContext) = try connection()
        let (open, openContext) = try connection()
        answer("gone\n", on: closingContext, flushedBy: flush)
        answer("kept\n", on: openContext, flushedBy: flush)
        _ = try closing.finish(acceptAlreadyClosed: false)

        loop.run()
        #expect(try flushed(open) == ["kept\n"])
        _ = try open.finish()
    }
}
