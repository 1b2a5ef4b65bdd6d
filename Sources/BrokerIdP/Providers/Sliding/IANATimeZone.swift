import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// A time zone by IANA name (`Europe/Berlin`), read from the system's tz database
/// (`/usr/share/zoneinfo`, Debian's `tzdata`) instead of ICU, which brokerd does not link.
/// `UTC`, `Etc/UTC` and `GMT` need no database.
public struct IANATimeZone: Sendable, Equatable {
    /// Where the system keeps the database.
    public static let systemDatabase = "/usr/share/zoneinfo"
    /// Coordinated Universal Time.
    public static let utc = IANATimeZone(identifier: "UTC", transitions: [], offsets: [0], rule: nil)

    /// The largest database file read (real ones are under 4 KiB).
    package static let maximumFileSize = 64 * 1024

    /// The name it was found by.
    public let identifier: String
    /// Instants (seconds since 1970, ascending) at which the offset changes.
    private let transitions: [Int64]
    /// Seconds east of UTC: `offsets[0]` before the first transition, `offsets[i + 1]` from
    /// `transitions[i]` on.
    private let offsets: [Int32]
    /// The offsets after the last transition (the file's footer), when they follow a rule.
    private let rule: POSIXZoneRule?

    private init(identifier: String, transitions: [Int64], offsets: [Int32], rule: POSIXZoneRule?) {
        self.identifier = identifier
        self.transitions = transitions
        self.offsets = offsets
        self.rule = rule
    }

    /// The zone named `identifier`; `nil` when it is not a zone name or the database does not
    /// hold it (or holds something unreadable, or a file someone other than root could change).
    public init?(identifier: String, database: String = IANATimeZone.systemDatabase) {
        if ["UTC", "Etc/UTC", "GMT", "Etc/GMT"].contains(identifier) {
            self = IANATimeZone(identifier: identifier, transitions: [], offsets: [0], rule: nil)
            return
        }
        guard Self.isZoneName(identifier), let data = Self.read(database + "/" + identifier),
            let parsed = TZifFile(data)
        else { return nil }
        self.init(identifier: identifier, transitions: parsed.transitions, offsets: parsed.offsets, rule: parsed.rule)
    }

    /// The instant at which clocks in this zone show `wallClock` (that reading written as if it
    /// were UTC). A reading that occurs twice (clocks set back) is the earlier instant; one that
    /// never occurs (clocks set forward) is read with the offset from before the change.
    public func date(wallClock: Date) -> Date {
        let local = Int64(Bounds.date(wallClock).timeIntervalSince1970.rounded(.down))
        let fraction = wallClock.timeIntervalSince1970 - Double(local)
        // The offsets in force a day either side cover every change of the offset near `local`.
        let candidates = [offset(at: local - 86_400), offset(at: local + 86_400)].sorted(by: >)
        let fitting = candidates.first { offset(at: local - Int64($0)) == $0 } ?? candidates[1]
        return Date(timeIntervalSince1970: Double(local - Int64(fitting)) + fraction)
    }

    private func offset(at instant: Int64) -> Int32 {
        guard let last = transitions.last, instant < last else {
            return rule?.offset(at: instant) ?? offsets[offsets.count - 1]
        }
        // The number of transitions at or before `instant`.
        var low = 0
        var high = transitions.count
        while low < high {
            let middle = (low + high) / 2
            if transitions[middle] <= instant { low = middle + 1 } else { high = middle }
        }
        return offsets[low]
    }

    /// Whether `name` is a relative path of the database's kind: parts of ASCII letters,
    /// digits, `_`, `-` and `+`, none of them `.` or `..`.
    package static func isZoneName(_ name: String) -> Bool {
        guard !name.isEmpty, name.utf8.count <= 255 else { return false }
        return name.split(separator: "/", omittingEmptySubsequences: false).allSatisfy { part in
            guard let first = part.utf8.first, first != UInt8(ascii: "-") else { return false }
            return part.utf8.allSatisfy { byte in
                (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
                    || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
                    || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                    || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "+")
            }
        }
    }

    /// The database file at `path` (links within the database are followed, as `US/Eastern`
    /// is one), when it is a regular file of root's that no one else may write.
    private static func read(_ path: String) -> Data? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_uid == 0,
            info.st_mode & (S_IWGRP | S_IWOTH) == 0, info.st_size <= maximumFileSize
        else { return nil }
        var bytes = [UInt8](repeating: 0, count: Int(info.st_size))
        var filled = 0
        while filled < bytes.count {
            let count = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + filled, $0.count - filled) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { return nil }
            filled += count
        }
        return Data(bytes)
    }
}

/// The parts of a TZif file (RFC 8536) a zone needs: its transitions, the offsets they lead
/// to, and the footer rule for later instants. Version 1 files are read from their 32-bit
/// block, later versions from their 64-bit block.
package struct TZifFile {
    package var transitions: [Int64] = []
    package var offsets: [Int32] = []
    package var rule: POSIXZoneRule?

    package init?(_ data: Data) {
        var reader = ByteReader(bytes: [UInt8](data))
        guard let first = reader.header() else { return nil }
        guard first.version >= 2 else {
            guard let block = reader.block(first, timeSize: 4) else { return nil }
            (transitions, offsets) = block
            return
        }
        guard reader.skip(first.blockSize(timeSize: 4)), let second = reader.header(),
            let block = reader.block(second, timeSize: 8)
        else { return nil }
        (transitions, offsets) = block
        // The footer: `\n`, a POSIX TZ string (possibly empty), `\n`.
        guard reader.take() == UInt8(ascii: "\n"), let footer = reader.line() else { return nil }
        if !footer.isEmpty {
            guard let rule = POSIXZoneRule(footer) else { return nil }
            self.rule = rule
        }
    }
}

/// Reads a TZif file front to back; every read is bounds-checked.
private struct ByteReader {
    struct Header {
        var version: Int
        var isUTCCount, isStandardCount, leapCount, transitionCount, typeCount, characterCount: Int

        func blockSize(timeSize: Int) -> Int {
            transitionCount * (timeSize + 1) + typeCount * 6 + characterCount + leapCount * (timeSize + 4)
                + isStandardCount + isUTCCount
        }
    }

    let bytes: [UInt8]
    var index = 0

    mutating func take() -> UInt8? {
        guard index < bytes.count else { return nil }
        defer { index += 1 }
        return bytes[index]
    }

    mutating func skip(_ count: Int) -> Bool {
        guard count >= 0, count <= bytes.count - index else { return false }
        index += count
        return true
    }

    /// A big-endian signed integer of `size` bytes (4 or 8).
    mutating func integer(size: Int) -> Int64? {
        guard size <= bytes.count - index else { return nil }
        var value: UInt64 = 0
        for byte in bytes[index..<index + size] { value = value << 8 | UInt64(byte) }
        index += size
        return size == 4 ? Int64(Int32(truncatingIfNeeded: value)) : Int64(bitPattern: value)
    }

    /// The text up to the next newline (consumed), when it is printable ASCII.
    mutating func line() -> String? {
        guard let end = bytes[index...].firstIndex(of: UInt8(ascii: "\n")) else { return nil }
        let text = bytes[index..<end]
        guard text.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else { return nil }
        index = end + 1
        return String(decoding: text, as: UTF8.self)
    }

    mutating func header() -> Header? {
        guard bytes.count - index >= 44, bytes[index..<index + 4].elementsEqual("TZif".utf8) else { return nil }
        let versionByte = bytes[index + 4]
        index += 20
        var counts: [Int] = []
        for _ in 0..<6 {
            guard let count = integer(size: 4), count >= 0, count <= Int64(bytes.count) else { return nil }
            counts.append(Int(count))
        }
        guard counts[4] >= 1 else { return nil }  // at least one local time type
        let version = versionByte == 0 ? 1 : Int(versionByte) - Int(UInt8(ascii: "0"))
        guard version >= 1 else { return nil }
        return Header(
            version: version, isUTCCount: counts[0], isStandardCount: counts[1], leapCount: counts[2],
            transitionCount: counts[3], typeCount: counts[4], characterCount: counts[5])
    }

    /// The transitions and the offset each leads to, from a data block; `offsets[0]` is the
    /// offset before the first transition (the first local time type, RFC 8536 section 3.2).
    mutating func block(_ header: Header, timeSize: Int) -> ([Int64], [Int32])? {
        let start = index
        var times: [Int64] = []
        for _ in 0..<header.transitionCount {
            guard let time = integer(size: timeSize), times.last.map({ $0 < time }) ?? true else { return nil }
            times.append(time)
        }
        var typeIndices: [Int] = []
        for _ in 0..<header.transitionCount {
            guard let index = take(), Int(index) < header.typeCount else { return nil }
            typeIndices.append(Int(index))
        }
        var typeOffsets: [Int32] = []
        for _ in 0..<header.typeCount {
            // utoff, isdst, desigidx; RFC 8536 forbids -2^31 and limits offsets to under a day.
            guard let offset = integer(size: 4), abs(offset) < 86_400, skip(2) else { return nil }
            typeOffsets.append(Int32(offset))
        }
        guard skip(start + header.blockSize(timeSize: timeSize) - index) else { return nil }
        return (times, [typeOffsets[0]] + typeIndices.map { typeOffsets[$0] })
    }
}
