import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import NIOCore

/// Raised when a request line exceeds the protocol's limit.
struct LineTooLongError: Error {}

/// Cuts received bytes into `\n`-terminated lines of at most `limit` bytes, one line when the
/// connection asks for it, so a connection that must not take more work leaves the rest here.
///
/// A line that grows past the limit raises `LineTooLongError` as soon as it does, so an
/// oversized line is never held whole. A trailing `\r` is dropped from each line.
///
/// Received bytes may carry secrets (a refresh token in `add` or `set_tokens`), and the read
/// buffers they came in are SwiftNIO's, reused for the connection's next reads rather than
/// freed (so brokerd's wipe-on-free allocator never sees them): every byte copied out of a
/// buffer here is wiped where it was, and so is every byte let go of untaken (`discard`). The
/// lines taken are wiped by their reader once decoded (docs/security.md, "Secrets in memory").
struct LineFramer {
    let limit: Int
    /// Received bytes not yet taken as lines.
    private var pending = ByteBuffer()
    /// Bytes at the start of `pending` already searched for a newline.
    private var scanned = 0

    init(limit: Int = maximumLineLength) { self.limit = limit }

    /// Whether received bytes wait here (a half-sent line, or lines not taken yet).
    var isEmpty: Bool { pending.readableBytes == 0 }

    /// The memory the waiting bytes keep alive.
    var heldBytes: Int { isEmpty ? 0 : pending.storageCapacity }

    /// Adds bytes read from the peer. Bytes joining a half-sent line are copied, with the line
    /// so far, into a buffer of their own, and wiped in the buffers they came from.
    mutating func append(_ bytes: ByteBuffer) {
        if pending.readableBytes == 0 {
            pending = bytes
            scanned = 0
        } else {
            var joined = ByteBuffer()
            joined.reserveCapacity(pending.readableBytes + bytes.readableBytes)
            joined.writeImmutableBuffer(pending)
            joined.writeImmutableBuffer(bytes)
            Self.wipe(pending)
            Self.wipe(bytes)
            pending = joined
        }
    }

    /// The next complete line, or nil if none has arrived yet.
    mutating func nextLine() throws(LineTooLongError) -> ByteBuffer? {
        let view = pending.readableBytesView
        guard let newline = view[(view.startIndex + scanned)...].firstIndex(of: UInt8(ascii: "\n")) else {
            scanned = view.count
            if view.count > limit { throw LineTooLongError() }
            return nil
        }
        let consumed = newline - view.startIndex
        if consumed > limit { throw LineTooLongError() }
        scanned = 0
        let length = consumed > 0 && view[newline - 1] == UInt8(ascii: "\r") ? consumed - 1 : consumed
        let line = pending.getSlice(at: pending.readerIndex, length: length)!
        pending.moveReaderIndex(forwardBy: consumed + 1)
        return line
    }

    /// Lets go of the read buffer the waiting bytes came in: they move to a buffer of their
    /// own size, so a few bytes of a half-sent line do not keep a whole read buffer alive.
    mutating func compact(allocator: ByteBufferAllocator) {
        if pending.readableBytes == 0 {
            pending = ByteBuffer()
        } else if pending.storageCapacity > 2 * pending.readableBytes {
            var copy = allocator.buffer(capacity: pending.readableBytes)
            copy.writeImmutableBuffer(pending)
            Self.wipe(pending)
            pending = copy
        }
    }

    /// Wipes and lets go of the bytes waiting here (the connection is closing).
    mutating func discard() {
        Self.wipe(pending)
        pending = ByteBuffer()
        scanned = 0
    }

    /// Zeroes the readable bytes of `buffer` where they lie, in storage it may share with
    /// the read buffer they arrived in (no copy-on-write: that would wipe a copy).
    static func wipe(_ buffer: ByteBuffer) {
        buffer.withUnsafeReadableBytes { SecretBytes.wipe(UnsafeMutableRawBufferPointer(mutating: $0)) }
    }
}
