import BrokerModel
import FoundationEssentials

/// A secret (refresh token, refresh URL, client secret) held in guarded memory: a slot of
/// `SecretArena`, locked in RAM (while `RLIMIT_MEMLOCK` allows) between inaccessible guard
/// pages, written once and then read-only, wiped when the last reference goes. Equal in
/// constant time; never printed (`description`, `debugDescription` and `dump` say `<secret>`);
/// Codable as a JSON string for the vault's plaintext only. Making one fails with
/// `BrokerFailure.outOfGuardedMemory` when no memory can be mapped for it: the request that
/// brought the secret is refused, and the broker goes on.
public final class SecretBytes: @unchecked Sendable {
    private let place: SecretArena.Place
    private let arena: SecretArena
    /// Length in bytes.
    public let count: Int

    private var memory: UnsafeMutableRawPointer { place.bytes }

    private init(place: SecretArena.Place, arena: SecretArena, count: Int) {
        self.place = place
        self.arena = arena
        self.count = count
    }

    /// Copies `bytes` into guarded memory; the caller drops (or wipes) its own copy.
    public convenience init(bytes: UnsafeRawBufferPointer) throws(BrokerFailure) {
        let arena = SecretArena.current
        self.init(place: try arena.store(bytes), arena: arena, count: bytes.count)
    }

    /// Copies the UTF-8 of `text` into guarded memory.
    public convenience init(_ text: String) throws(BrokerFailure) {
        var text = text
        text.makeContiguousUTF8()
        let arena = SecretArena.current
        let stored = text.utf8.withContiguousStorageIfAvailable { bytes in
            Result { () throws(BrokerFailure) in try arena.store(UnsafeRawBufferPointer(bytes)) }
        }
        self.init(place: try stored!.get(), arena: arena, count: text.utf8.count)
    }

    deinit { arena.release(place) }

    /// Whether every secret the broker has stored was locked in RAM; `false` once
    /// `RLIMIT_MEMLOCK` refused a slab (logged once; `status` shows it).
    public static var allLocked: Bool { SecretArena.shared.allLocked }

    /// Calls `body` with the secret's bytes, for copying them into the buffer being written.
    public func withUnsafeBytes<T, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> T) throws(E) -> T {
        try body(UnsafeRawBufferPointer(start: memory, count: count))
    }

    /// A transient copy as text, for an API that takes only a `String` (a form body, a header);
    /// drop it at once (brokerd's allocator wipes it when freed).
    public var text: String { withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }

    public var isEmpty: Bool { count == 0 }

    /// Overwrites `bytes` with zeros where they lie (a buffer that outlives the secret it held).
    public static func wipe(_ bytes: UnsafeMutableRawBufferPointer) { Sodium.wipe(bytes) }
}

extension SecretBytes: Equatable {
    /// Constant-time comparison of the bytes (the lengths are not secret).
    public static func == (lhs: SecretBytes, rhs: SecretBytes) -> Bool {
        lhs === rhs || (lhs.count == rhs.count && Sodium.constantTimeEqual(lhs.memory, rhs.memory, count: lhs.count))
    }
}

extension SecretBytes: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var description: String { "<secret>" }
    public var debugDescription: String { "<secret>" }
    public var customMirror: Mirror { Mirror(self, children: []) }
}

extension SecretBytes: Codable {
    public convenience init(from decoder: any Decoder) throws {
        try self.init(try decoder.singleValueContainer().decode(String.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(text)
    }
}
