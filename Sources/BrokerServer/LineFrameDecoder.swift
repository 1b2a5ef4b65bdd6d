import BrokerProtocol
import NIOCore

/// Raised when a request line exceeds the protocol's limit.
struct LineTooLongError: Error {}

/// Splits the byte stream into `\n`-terminated lines of at most `limit` bytes.
///
/// A line that grows past the limit raises `LineTooLongError` as soon as it does, so an
/// oversized line is never buffered whole. A half line left when the peer disconnects is dropped.
struct LineFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer

    let limit: Int
    /// Bytes of the pending line already searched for a newline.
    private var scanned = 0

    init(limit: Int = maximumLineLength) { self.limit = limit }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let view = buffer.readableBytesView
        guard let newline = view[(view.startIndex + scanned)...].firstIndex(of: UInt8(ascii: "\n")) else {
            scanned = view.count
            if view.count > limit { throw LineTooLongError() }
            return .needMoreData
        }
        var length = newline - view.startIndex
        if length > limit { throw LineTooLongError() }
        scanned = 0
        if length > 0, view[newline - 1] == UInt8(ascii: "\r") { length -= 1 }
        let line = buffer.getSlice(at: buffer.readerIndex, length: length)!
        buffer.moveReaderIndex(forwardBy: newline - view.startIndex + 1)
        context.fireChannelRead(wrapInboundOut(line))
        return .continue
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws
        -> DecodingState
    {
        while try decode(context: context, buffer: &buffer) == .continue {}
        buffer.moveReaderIndex(to: buffer.writerIndex)
        return .needMoreData
    }
}
