@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `SecretBytes` and its arena on their own: the bytes come back as given, compare by content,
/// never print, travel through JSON as a string, and a released secret's slot is wiped at once.
@Suite struct SecretBytesTests {
    static let text = "rt-" + String(repeating: "0123456789abcdef", count: 4)

    @Test(arguments: [0, 1, 31, 32, 33, 2048, 2049, 10_000, 3 << 20])
    func bytesComeBackAsGivenAtEverySize(length: Int) throws {
        let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
        let secret = try bytes.withUnsafeBytes { try SecretBytes(bytes: $0) }
        #expect(secret.count == length)
        #expect(secret.withUnsafeBytes { Array($0) } == bytes)
    }

    @Test func equalByContent() throws {
        #expect(try SecretBytes(Self.text) == SecretBytes(Self.text))
        #expect(try SecretBytes(Self.text) != SecretBytes(Self.text + "x"))
        #expect(try SecretBytes(Self.text) != SecretBytes(String(Self.text.dropLast()) + "X"))
        #expect(try SecretBytes(Self.text).text == Self.text)
    }

    @Test func neverPrinted() throws {
        let secret = try SecretBytes(Self.text)
        var dumped = ""
        dump(secret, to: &dumped)
        for shown in [
            "\(secret)", String(describing: secret), String(reflecting: secret), dumped,
            String(describing: AccountSecrets(refreshToken: secret)),
        ] {
            #expect(!shown.contains("0123456789"), "\(shown)")
            #expect(shown.contains("<secret>"), "\(shown)")
        }
    }

    @Test func codableAsAString() throws {
        let secrets = AccountSecrets(refreshToken: try SecretBytes(Self.text), clientSecret: SecretBytes("cs"))
        let json = try JSONEncoder().encode(secrets)
        #expect(String(decoding: json, as: UTF8.self).contains("\"\(Self.text)\""))
        #expect(try JSONDecoder().decode(AccountSecrets.self, from: json) == secrets)
    }

    /// The slot of a released secret reads as zeros at once (slabs stay mapped, so reading it
    /// afterwards is safe). 1,500 bytes: a slot size no other test uses, so none takes it meanwhile.
    @Test func aReleasedSecretIsWipedAtOnce() throws {
        var secret: SecretBytes? = try SecretBytes(String(repeating: Self.text, count: 22))
        let address = secret!.withUnsafeBytes { UInt(bitPattern: $0.baseAddress) }
        let count = secret!.count
        secret = nil
        let left = UnsafeRawBufferPointer(start: UnsafeRawPointer(bitPattern: address), count: count)
        #expect(count > 1024 && left.allSatisfy { $0 == 0 }, "the slot still holds the secret")
    }
}

/// Many secrets stored at once (`SecretArena.storing`): each slab is writable during the batch
/// and read-only again after it, every secret as given. A private arena, so no other test's
/// batch keeps its slabs writable.
@Suite struct SecretArenaBatchTests {
    /// The permissions (`r--p`, `rw-p`, ...) of the mapping holding `address`, from /proc/self/maps.
    private static func permissions(at address: UnsafeMutableRawPointer) throws -> String? {
        let value = UInt(bitPattern: address)
        // Read to its end with read(2): its size shows as 0, where a reader of whole files may stop.
        let fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw HarnessError("cannot open /proc/self/maps: errno \(errno)") }
        defer { close(fd) }
        var maps: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while case let count = read(fd, &chunk, chunk.count), count > 0 { maps += chunk[..<count] }
        for line in String(decoding: maps, as: UTF8.self).split(separator: "\n") {
            let fields = line.split(separator: " ")
            let bounds = fields[0].split(separator: "-").compactMap { UInt($0, radix: 16) }
            if bounds.count == 2, bounds[0] <= value, value < bounds[1] { return String(fields[1]) }
        }
        return nil
    }

    @Test func slabsAreWritableDuringABatchAndReadOnlyAfterIt() throws {
        let arena = SecretArena()
        let texts = (0..<600).map { "secret-\($0)-" + String(repeating: "s", count: $0 % 200) }
        var inside: [String?] = []
        let places = try arena.storing {
            let places = try texts.map { text in
                try text.utf8.withContiguousStorageIfAvailable { bytes in
                    Result { () throws(BrokerFailure) in try arena.store(.init(bytes)) }
                }!.get()
            }
            inside = try places.map { try Self.permissions(at: $0.bytes) }
            return places
        }
        let after = try places.map { try Self.permissions(at: $0.bytes) }
        #expect(inside.allSatisfy { $0?.hasPrefix("rw") == true }, "writable during the batch: \(Set(inside))")
        #expect(after.allSatisfy { $0?.hasPrefix("r-") == true }, "read-only after it: \(Set(after))")
        let stored = zip(places, texts).map { place, text in
            String(decoding: UnsafeRawBufferPointer(start: place.bytes, count: text.utf8.count), as: UTF8.self)
        }
        #expect(stored == texts)
        for place in places { arena.release(place) }
        let released = try places.map { try Self.permissions(at: $0.bytes) }
        #expect(released.allSatisfy { $0?.hasPrefix("r-") == true }, "read-only once released: \(Set(released))")
    }
}

/// The arena under pressure: large secrets share slabs, so mappings stay few; an arena that can
/// map nothing more refuses the secret with an error, and the process goes on.
@Suite struct SecretArenaPressureTests {
    /// Lines of /proc/self/maps: the process's mappings.
    private static func mappingCount() throws -> Int {
        let fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw HarnessError("cannot open /proc/self/maps: errno \(errno)") }
        defer { close(fd) }
        var lines = 0
        var chunk = [UInt8](repeating: 0, count: 65536)
        while case let count = read(fd, &chunk, chunk.count), count > 0 {
            lines += chunk[..<count].count(where: { $0 == UInt8(ascii: "\n") })
        }
        return lines
    }

    /// 2,000 secrets of 9 KB (a JWT access token with its prepared answer, 1,000 accounts):
    /// one mapping each would be 6,000 more lines in /proc/self/maps; shared slabs of 16 slots
    /// need about 130 slabs.
    @Test func manyLargeSecretsShareAFewMappings() throws {
        let arena = SecretArena()
        let before = try Self.mappingCount()
        let secrets = try SecretArena.$current.withValue(arena) {
            try (0..<2000).map { index throws(BrokerFailure) in
                try SecretBytes("at-\(index)-" + String(repeating: "j", count: 9000))
            }
        }
        let added = try Self.mappingCount() - before
        #expect(arena.regionCount <= 2000 / 16 + 8, "\(arena.regionCount) regions")
        #expect(added < 1000, "\(added) more mappings")
        #expect(secrets[1234].text == "at-1234-" + String(repeating: "j", count: 9000))
    }

    @Test func anArenaThatCannotMapRefusesTheSecret() throws {
        let arena = SecretArena(pages: GuardedPages(budget: 16 * 1024))
        let kept = try SecretArena.$current.withValue(arena) { try SecretBytes(String("fits in the first slab")) }
        for size in [20 * 1024, 3 << 20] {
            #expect(throws: BrokerFailure.outOfGuardedMemory) {
                try SecretArena.$current.withValue(arena) { try SecretBytes(String(repeating: "x", count: size)) }
            }
        }
        #expect(kept.text == "fits in the first slab")
        let elsewhere = "the shared arena still serves"
        #expect(try SecretBytes(elsewhere).text == elsewhere)
    }
}
