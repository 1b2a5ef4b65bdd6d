import BrokerModel
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Guarded memory for many secrets: slabs of `GuardedPages` (guard pages on both sides, left
/// out of core dumps, locked in RAM while `RLIMIT_MEMLOCK` allows, read-only except while one
/// of their slots is written or wiped) cut into slots of one power-of-two size each, 32 bytes
/// to 2 MiB, so that 1,000 accounts cost a few locked pages rather than two pages per secret.
///
/// Large secrets share slabs too, so the number of mappings stays bounded (each slab is three:
/// two guard mappings and its pages; the kernel allows `vm.max_map_count`, 65,530 by default):
/// a class's first slab is 16 KiB (or one slot), each next one twice the last, up to 16 slots
/// or 1 MiB, whichever is smaller (at least one slot). A broker with few secrets keeps its
/// small slabs; one with thousands of 9 KB tokens maps a slab per 16 of them, and mappings run
/// out only after gigabytes of secrets. Only a secret over 2 MiB (larger than any the broker
/// accepts from an IdP) gets a region of its own.
///
/// Slabs are kept for reuse while the arena lives; a released slot is wiped at once. Many secrets
/// stored at once (a vault being loaded) share one writable window per slab: see `storing(_:)`.
/// A slab that cannot be locked is used unlocked, and the first such is logged (a warning) and
/// shown by `allLocked`; a slab that cannot be mapped fails the store, and with it the request
/// that needed the secret (`BrokerFailure.outOfGuardedMemory`), never the process.
package final class SecretArena: Sendable {
    /// The one arena of the process.
    package static let shared = SecretArena()

    /// The arena new secrets go to: `shared`, unless a test gives its task one whose pages run
    /// out.
    @TaskLocal package static var current = shared

    /// Slot sizes in bytes, 32 B to 2 MiB (an IdP's answer is at most 1 MiB; a prepared answer
    /// holding a JWT access token and an id token often passes 2 KiB).
    package static let slotSizes = (5...21).map { 1 << $0 }
    package static let firstSlabSize = 16 * 1024
    /// What a class's slabs grow to: 16 slots, or 1 MiB when that is smaller.
    package static func largestSlab(slot: Int) -> Int { max(firstSlabSize, slot, min(16 * slot, 1 << 20)) }

    /// Where a secret's bytes live, and what to give back when it goes.
    package struct Place: @unchecked Sendable {
        package let bytes: UnsafeMutableRawPointer
        /// The slab holding the slot, or the secret's own region (`sizeClass` -1).
        fileprivate let slab: GuardedPages.Region
        fileprivate let sizeClass: Int
    }

    private struct State: @unchecked Sendable {
        /// Free slots by size class, each with its slab.
        var free = [[(slab: GuardedPages.Region, slot: UnsafeMutableRawPointer)]](
            repeating: [], count: SecretArena.slotSizes.count)
        /// The size of each class's last slab (0 before its first).
        var lastSlab = [Int](repeating: 0, count: SecretArena.slotSizes.count)
        /// Every slab, for an arena that goes (a test's).
        var slabs: [GuardedPages.Region] = []
        /// Regions mapped: slabs and secrets' own regions.
        var regions = 0
        /// Whether a region could not be locked in RAM.
        var lockRefused = false
        /// How many `storing(_:)` calls are under way; while any is, slabs written stay writable.
        var batches = 0
        /// The slabs left writable by the batches under way, made read-only when the last ends.
        var writable: Set<GuardedPages.Region> = []
    }

    private let pages: GuardedPages
    private let state = Mutex(State())

    /// An arena whose memory comes from `pages`.
    package init(pages: GuardedPages = GuardedPages()) { self.pages = pages }

    /// Wipes and unmaps the slabs (every secret holds its arena, so none is left in them).
    deinit { state.withLock { for slab in $0.slabs { pages.unmap(slab) } } }

    /// Whether every region so far was locked in RAM (`status` shows it).
    package var allLocked: Bool { state.withLock { !$0.lockRefused } }

    /// How many regions the arena has mapped (slabs and secrets of their own).
    package var regionCount: Int { state.withLock { $0.regions } }

    /// A copy of `bytes` in guarded memory: in a slot the task's `reservation` holds when one
    /// fits, otherwise in a free slot of the arena.
    package func store(_ bytes: UnsafeRawBufferPointer) throws(BrokerFailure) -> Place {
        let copy = { (target: UnsafeMutableRawPointer) in
            if let base = bytes.baseAddress { target.copyMemory(from: base, byteCount: bytes.count) }
        }
        guard let sizeClass = Self.slotSizes.firstIndex(where: { $0 >= bytes.count }) else {
            let region = try map(bytes.count)
            pages.makeWritable(region)
            copy(region.start)
            pages.makeReadOnly(region)
            return Place(bytes: region.start, slab: region, sizeClass: -1)
        }
        let reserved = Self.reservation?.take(atLeast: sizeClass, of: self)
        let (place, lockError) = try state.withLock { state throws(BrokerFailure) in
            var lockError: Int32?
            let taken: Place
            if let reserved {
                taken = reserved
            } else {
                taken = try takeSlot(sizeClass, in: &state, lockError: &lockError)
            }
            writing(taken.slab, in: &state) { copy(taken.bytes) }
            return (taken, lockError)
        }
        if let lockError { Self.logLockRefused(lockError) }
        return place
    }

    /// Takes a free slot of `sizeClass`, mapping a new slab for the class when it has none, or,
    /// when no slab can be mapped, the smallest free slot of a larger class.
    private func takeSlot(_ sizeClass: Int, in state: inout State, lockError: inout Int32?) throws(BrokerFailure)
        -> Place
    {
        if state.free[sizeClass].isEmpty {
            let slot = Self.slotSizes[sizeClass]
            let wanted = min(
                Self.largestSlab(slot: slot), max(Self.firstSlabSize, slot, 2 * state.lastSlab[sizeClass]))
            guard let (slab, error) = pages.map(wanted) else {
                guard let larger = state.free.indices.dropFirst(sizeClass + 1).first(where: { !state.free[$0].isEmpty })
                else { throw BrokerFailure.outOfGuardedMemory }
                let (slab, slot) = state.free[larger].removeLast()
                return Place(bytes: slot, slab: slab, sizeClass: larger)
            }
            lockError = noteMapped(error, in: &state) ?? lockError
            state.lastSlab[sizeClass] = slab.size
            state.slabs.append(slab)
            state.free[sizeClass] = stride(from: slab.size - slot, through: 0, by: -slot).map {
                (slab, slab.start + $0)
            }
        }
        let (slab, slot) = state.free[sizeClass].removeLast()
        return Place(bytes: slot, slab: slab, sizeClass: sizeClass)
    }

    /// Takes a slot for a secret of each of `sizes` bytes (at most 2 MiB each), all or none.
    fileprivate func takeSlots(_ sizes: [Int]) throws(BrokerFailure) -> [Place] {
        let (places, lockError) = try state.withLock { state throws(BrokerFailure) in
            var lockError: Int32?
            var places: [Place] = []
            for size in sizes {
                guard let sizeClass = Self.slotSizes.firstIndex(where: { $0 >= size }) else { continue }
                do throws(BrokerFailure) {
                    places.append(try takeSlot(sizeClass, in: &state, lockError: &lockError))
                } catch {
                    Self.putBack(places, in: &state)
                    throw error
                }
            }
            return (places, lockError)
        }
        if let lockError { Self.logLockRefused(lockError) }
        return places
    }

    /// Gives back slots taken by `takeSlots` and never written.
    fileprivate func giveBack(_ places: [Place]) {
        state.withLock { Self.putBack(places, in: &$0) }
    }

    /// Returns free slots (wiped, or never written) to their classes.
    private static func putBack(_ places: [Place], in state: inout State) {
        for place in places { state.free[place.sizeClass].append((place.slab, place.bytes)) }
    }

    /// Wipes the secret at `place` and takes its memory back.
    package func release(_ place: Place) {
        guard place.sizeClass >= 0 else {
            pages.unmap(place.slab)
            state.withLock { $0.regions -= 1 }
            return
        }
        state.withLock { state in
            writing(place.slab, in: &state) {
                Sodium.wipe(UnsafeMutableRawBufferPointer(start: place.bytes, count: Self.slotSizes[place.sizeClass]))
            }
            Self.putBack([place], in: &state)
        }
    }

    /// Runs `body`, which stores many secrets, with each slab it writes to made writable once
    /// (rather than twice per secret) and read-only again when it returns: two system calls per
    /// slab instead of two per secret. The slabs stay guarded throughout.
    package func storing<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        state.withLock { $0.batches += 1 }
        defer {
            state.withLock { state in
                state.batches -= 1
                guard state.batches == 0 else { return }
                for slab in state.writable { pages.makeReadOnly(slab) }
                state.writable = []
            }
        }
        return try body()
    }

    /// A region of its own for a secret of `count` bytes.
    private func map(_ count: Int) throws(BrokerFailure) -> GuardedPages.Region {
        guard let (region, error) = pages.map(count) else { throw BrokerFailure.outOfGuardedMemory }
        if let lockError = state.withLock({ noteMapped(error, in: &$0) }) { Self.logLockRefused(lockError) }
        return region
    }

    /// Counts a region mapped, with the errno of its failed `mlock`; returns that errno when it
    /// is the first refusal, to be logged.
    private func noteMapped(_ lockError: Int32?, in state: inout State) -> Int32? {
        state.regions += 1
        guard let lockError, !state.lockRefused else { return nil }
        state.lockRefused = true
        return lockError
    }

    /// Runs `body`, which writes into `slab`, with the slab writable: for that call only, or
    /// until the batches under way end.
    private func writing(_ slab: GuardedPages.Region, in state: inout State, _ body: () -> Void) {
        guard state.batches > 0 else {
            pages.makeWritable(slab)
            body()
            pages.makeReadOnly(slab)
            return
        }
        if state.writable.insert(slab).inserted { pages.makeWritable(slab) }
        body()
    }

    /// Logs, once per arena, that secrets are no longer all locked in RAM, and why.
    private static func logLockRefused(_ error: Int32) {
        var limit = rlimit()
        let bytes =
            getrlimit(__rlimit_resource_t(__RLIMIT_MEMLOCK.rawValue), &limit) == 0 ? "\(limit.rlim_cur)" : "unknown"
        Logger(label: "brokerd").warning(
            """
            cannot lock secrets in memory (mlock: \(String(cString: strerror(error)))); they stay usable but may be \
            swapped out; raise the locked-memory limit (RLIMIT_MEMLOCK, LimitMEMLOCK=)
            """,
            metadata: ["memlock_limit_bytes": "\(bytes)"])
    }
}

extension SecretArena {
    /// The slots the current task holds for the secrets of an answer it awaits (a refresh's).
    @TaskLocal package static var reservation: Reservation?

    /// Guarded memory taken before an IdP is called, for the secrets its answer brings: once
    /// the IdP has answered a refresh, the credential presented is spent, and an answer that
    /// found no memory would lose its successor. A refresh's task holds an empty one of the
    /// task's arena (`SecretArena.reservation`); `fill` takes the slots before the call
    /// (failing, and calling nothing, when no memory can be had), `store` uses them first, and
    /// those left go back to the arena when the task ends.
    package final class Reservation: Sendable {
        private let arena: SecretArena
        private let slots = Mutex<[Place]>([])

        package init(arena: SecretArena = .current) { self.arena = arena }

        deinit { slots.withLock { arena.giveBack($0) } }

        /// Takes one slot for a secret of each of `sizes` bytes, on top of those already held.
        package func fill(sizes: [Int]) throws(BrokerFailure) {
            let places = try arena.takeSlots(sizes)
            slots.withLock { $0 += places }
        }

        /// The smallest held slot of `sizeClass` or larger, taken out; `nil` for another arena.
        fileprivate func take(atLeast sizeClass: Int, of arena: SecretArena) -> Place? {
            guard arena === self.arena else { return nil }
            return slots.withLock { slots in
                let fitting = slots.indices.filter { slots[$0].sizeClass >= sizeClass }
                guard let index = fitting.min(by: { slots[$0].sizeClass < slots[$1].sizeClass }) else { return nil }
                return slots.remove(at: index)
            }
        }
    }
}
