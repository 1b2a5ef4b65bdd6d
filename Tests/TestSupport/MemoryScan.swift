import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// One mapping of a process, as `/proc/PID/smaps` describes it.
public struct MemoryMapping: Sendable, CustomStringConvertible {
    public let start: UInt64
    public let end: UInt64
    /// `rw-p`, `r--p`, `---p`, ...
    public let permissions: String
    /// The file or pseudo-name (`[heap]`, `[stack]`), empty for anonymous memory.
    public let name: String
    /// `VmFlags` holds `lo`: the pages are locked in RAM.
    public let locked: Bool

    public var description: String {
        "\(String(start, radix: 16))-\(String(end, radix: 16)) \(permissions)\(locked ? " locked" : "") \(name)"
    }
}

/// Every place where some needles occur in a live process's readable memory, read through
/// `/proc/PID/mem` (root, or a process allowed to ptrace the target), with each place's mapping
/// so that a test can tell guarded pages (locked, between two inaccessible mappings, as
/// brokerd maps its `GuardedPages`) from the rest.
public struct MemoryScan: Sendable {
    public let mappings: [MemoryMapping]
    /// For each needle, the index in `mappings` of each occurrence.
    private let places: [String: [Int]]
    /// Bytes read.
    public let scannedBytes: Int

    /// Reads every readable mapping of `pid` but the kernel's (`[vvar]`, `[vsyscall]`), skipping
    /// ranges the kernel refuses, and searches them for each needle.
    public init(pid: pid_t, needles: [String]) throws {
        try self.init(pid: pid, labeled: needles.map { ($0, Array($0.utf8)) })
    }

    /// Searches for byte strings that need not be text (a raw key), each found under its label.
    public init(pid: pid_t, labeled: [(label: String, bytes: [UInt8])]) throws {
        mappings = Self.parse(try Self.readWhole("/proc/\(pid)/smaps"))
        let descriptor = open("/proc/\(pid)/mem", O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw HarnessError("cannot open /proc/\(pid)/mem: errno \(errno)") }
        defer { close(descriptor) }
        let needles = labeled.map(\.label)
        let patterns = labeled.map(\.bytes)
        let overlap = (patterns.map(\.count).max() ?? 1) - 1
        let chunk = 1 << 20
        var buffer = [UInt8](repeating: 0, count: chunk + overlap)
        var found: [String: [Int]] = [:]
        var scanned = 0
        for (index, mapping) in mappings.enumerated()
        where mapping.permissions.hasPrefix("r") && !["[vvar]", "[vvar_vclock]", "[vsyscall]"].contains(mapping.name) {
            var address = mapping.start
            var carried = 0
            while address < mapping.end {
                let wanted = Int(min(UInt64(chunk), mapping.end - address))
                let read = buffer.withUnsafeMutableBytes {
                    pread(descriptor, $0.baseAddress! + carried, wanted, off_t(exactly: address) ?? -1)
                }
                guard read > 0 else {
                    (address, carried) = (address + UInt64(wanted), 0)
                    continue
                }
                scanned += read
                let filled = carried + read
                for (needle, pattern) in zip(needles, patterns) {
                    found[needle, default: []] += Self.occurrences(
                        of: pattern, in: buffer, count: filled, endingAfter: carried
                    )
                    .map { _ in index }
                }
                carried = min(overlap, filled)
                buffer.withUnsafeMutableBytes {
                    _ = memmove($0.baseAddress!, $0.baseAddress! + filled - carried, carried)
                }
                address += UInt64(read)
            }
        }
        places = found
        scannedBytes = scanned
    }

    /// The mappings where `needle` (or the bytes of that label) was found, once per occurrence.
    public func places(of needle: String) -> [MemoryMapping] { (places[needle] ?? []).map { mappings[$0] } }

    /// The occurrences of `needle` outside guarded pages.
    public func unguardedPlaces(of needle: String) -> [MemoryMapping] {
        (places[needle] ?? []).filter { !isGuarded($0) }.map { mappings[$0] }
    }

    /// Whether mapping `index` is locked and flanked by inaccessible mappings (guard pages).
    public func isGuarded(_ index: Int) -> Bool {
        let mapping = mappings[index]
        guard mapping.locked, index > 0, index + 1 < mappings.count else { return false }
        let before = mappings[index - 1]
        let after = mappings[index + 1]
        return before.end == mapping.start && before.permissions == "---p" && after.start == mapping.end
            && after.permissions == "---p"
    }

    /// Start offsets of `pattern` in the first `count` bytes of `bytes`, but those that end within
    /// the first `carried` bytes (carried over from the chunk before, which counted them).
    private static func occurrences(of pattern: [UInt8], in bytes: [UInt8], count: Int, endingAfter carried: Int)
        -> [Int]
    {
        var offsets: [Int] = []
        bytes.withUnsafeBytes { raw in
            pattern.withUnsafeBytes { needle in
                var from = 0
                while from + needle.count <= count,
                    let hit = gnuMemmem(raw.baseAddress! + from, count - from, needle.baseAddress!, needle.count)
                {
                    let offset = raw.baseAddress!.distance(to: UnsafeRawPointer(hit))
                    if offset + needle.count > carried { offsets.append(offset) }
                    from = offset + 1
                }
            }
        }
        return offsets
    }

    /// A /proc file read to its end (its size shows as 0, so whole-file readers stop short).
    private static func readWhole(_ path: String) throws -> String {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw HarnessError("cannot open \(path): errno \(errno)") }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            bytes += chunk[..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func parse(_ smaps: String) -> [MemoryMapping] {
        var mappings: [MemoryMapping] = []
        var header: (start: UInt64, end: UInt64, permissions: String, name: String)?
        for line in smaps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            if let range = fields.first, fields.count >= 5, range.contains("-"), !range.hasSuffix(":") {
                let bounds = range.split(separator: "-")
                guard bounds.count == 2, let start = UInt64(bounds[0], radix: 16),
                    let end = UInt64(bounds[1], radix: 16)
                else { continue }
                header = (start, end, String(fields[1]), fields.count > 5 ? fields[5...].joined(separator: " ") : "")
            } else if line.hasPrefix("VmFlags:"), let current = header {
                mappings.append(
                    MemoryMapping(
                        start: current.start, end: current.end, permissions: current.permissions, name: current.name,
                        locked: fields.contains("lo")))
                header = nil
            }
        }
        return mappings
    }
}

/// glibc's `memmem`, which the Glibc module leaves out (it is a GNU extension).
@_silgen_name("memmem")
private func gnuMemmem(
    _ haystack: UnsafeRawPointer, _ haystackLength: Int, _ needle: UnsafeRawPointer, _ needleLength: Int
) -> UnsafeMutableRawPointer?
