import NIOCore

/// What a connection's task writes back.
enum ConnectionReply: Sendable {
    /// The answer to a `ConnectionWork.run`.
    case answer(ByteBuffer)
    /// One event line of a subscription.
    case event(ByteBuffer)
    /// A last line, after which the connection is closed.
    case farewell(ByteBuffer)
}
