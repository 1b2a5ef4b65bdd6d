import Synchronization

/// Guarded memory for many small secrets: slabs of `sodium_malloc` memory (guard pages on
/// both sides, locked in RAM, read-only except while one of their slots is written or wiped)
/// cut into slots of a few sizes, so that 1,000 accounts cost a few locked pages rather than
/// two pages per secret. A secret longer than the largest slot gets an allocation of its own.
/// Slabs are kept for reuse, never unmapped; a released slot is wiped at once. Many secrets
/// stored at once (a vault being loaded) share one writable window per slab: see `storing(_:)`.
final class SecretArena: Sendable {
    /// The one arena of the process.
    static let shared = SecretArena()

    /// Slot sizes in bytes; a 16 KiB slab holds 512 of the smallest or 2 of the largest (a
    /// prepared answer holding a JWT access token and an id token often passes 2 KiB).
    static let slotSizes = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    static let slabSize = 16 * 1024

    /// Where a secret's bytes live, and what to give back when it goes.
    struct Place: @unchecked Sendable {
        let bytes: UnsafeMutableRawPointer
        /// The slab holding the slot, `nil` for an allocation of its own.
        fileprivate let slab: UnsafeMutableRawPointer?
        fileprivate let sizeClass: Int
    }

    /// Free slots by size class, each with its slab.
    private struct FreeSlots: @unchecked Sendable {
        var byClass = [[(slab: UnsafeMutableRawPointer, slot: UnsafeMutableRawPointer)]](
            repeating: [], count: SecretArena.slotSizes.count)
        /// How many `storing(_:)` calls are under way; while any is, slabs written stay writable.
        var batches = 0
        /// The slabs left writable by the batches under way, made read-only when the last ends.
        var writable: Set<UnsafeMutableRawPointer> = []

        /// Runs `body`, which writes into `slab`, with the slab writable: for that call only, or
        /// until the batches under way end.
        mutating func writing(_ slab: UnsafeMutableRawPointer, _ body: () -> Void) {
            guard batches > 0 else { return Sodium.whileWritable(slab, body) }
            if writable.insert(slab).inserted { Sodium.makeWritable(slab) }
            body()
        }
    }

    private let free = Mutex(FreeSlots())

    /// A copy of `bytes` in guarded memory.
    func store(_ bytes: UnsafeRawBufferPointer) -> Place {
        let copy = { (target: UnsafeMutableRawPointer) in
            if let base = bytes.baseAddress { target.copyMemory(from: base, byteCount: bytes.count) }
        }
        guard let sizeClass = Self.slotSizes.firstIndex(where: { $0 >= bytes.count }) else {
            return Place(bytes: Sodium.guardedAllocation(bytes.count, filling: copy), slab: nil, sizeClass: -1)
        }
        return free.withLock { free in
            if free.byClass[sizeClass].isEmpty {
                let size = Self.slotSizes[sizeClass]
                let slab = Sodium.guardedAllocation(Self.slabSize) { _ in }
                free.byClass[sizeClass] = stride(from: Self.slabSize - size, through: 0, by: -size).map {
                    (slab, slab + $0)
                }
            }
            let (slab, slot) = free.byClass[sizeClass].removeLast()
            free.writing(slab) { copy(slot) }
            return Place(bytes: slot, slab: slab, sizeClass: sizeClass)
        }
    }

    /// Wipes the secret at `place` and takes its memory back.
    func release(_ place: Place) {
        guard let slab = place.slab else {
            Sodium.guardedFree(place.bytes)
            return
        }
        free.withLock { free in
            free.writing(slab) {
                Sodium.wipe(UnsafeMutableRawBufferPointer(start: place.bytes, count: Self.slotSizes[place.sizeClass]))
            }
            free.byClass[place.sizeClass].append((slab, place.bytes))
        }
    }

    /// Runs `body`, which stores many secrets, with each slab it writes to made writable once
    /// (rather than twice per secret) and read-only again when it returns: two system calls per
    /// slab instead of two per secret. The slabs stay guarded and locked throughout.
    func storing<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        free.withLock { $0.batches += 1 }
        defer {
            free.withLock { free in
                free.batches -= 1
                guard free.batches == 0 else { return }
                for slab in free.writable { Sodium.makeReadOnly(slab) }
                free.writable = []
            }
        }
        return try body()
    }
}
