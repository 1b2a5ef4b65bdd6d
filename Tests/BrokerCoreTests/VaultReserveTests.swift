@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// protocol/VAULT.md, "Room for the next records": the log keeps room allocated ahead of its
/// end, saves go on into it on a full disk (a snapshot that cannot be written leaves the change
/// to the log), `ensureRoom` refuses once it runs low, and a record whose write failed is
/// written again in its place before the next. On a small tmpfs mounted for each test (as root).
@Suite(.serialized, .enabled(if: getuid() == 0, "mounts a tmpfs, as root"))
struct VaultReserveTests {
    /// A vault on a tmpfs of `kibibytes`, with its key beside the mount.
    struct Rig {
        let directory: TemporaryDirectory
        let disk: SmallTmpfs
        let key: SecretKey
        var path: String { disk.path + "/vault" }
        var logPath: String { path + ".log" }

        init(kibibytes: Int) throws {
            directory = try TemporaryDirectory()
            do {
                disk = try SmallTmpfs(at: directory.file("state"), kibibytes: kibibytes)
            } catch {
                directory.remove()
                throw error
            }
            key = try VaultKey.load(path: directory.file("key"), create: true)
        }

        func remove() {
            disk.unmount()
            directory.remove()
        }

        /// What a broker starting now would load.
        func load() throws -> [AccountRecord] { try Vault(path: path, key: key).load()?.accounts ?? [] }
    }

    /// `record` with a new refresh token of `length` characters, as a refresh leaves it.
    static func rotated(_ record: AccountRecord, length: Int = 40) -> AccountRecord {
        var record = record
        let token = "rt-" + UUID().uuidString
        record.secrets.refreshToken = try! SecretBytes(
            token + String(repeating: "r", count: max(0, length - token.count)))
        return record
    }

    @Test func ensureRoomStartsTheLogWithItsReserveAllocatedAheadOfItsEnd() throws {
        let rig = try Rig(kibibytes: 1024)
        defer { rig.remove() }
        let vault = try Vault(path: rig.path, key: rig.key)
        _ = try vault.load()
        try vault.save(VaultContents(accounts: [.sample("a")]))
        #expect(access(rig.logPath, F_OK) != 0, "a snapshot starts without a log")
        try vault.ensureRoom()
        var info = stat()
        #expect(stat(rig.logPath, &info) == 0)
        #expect(Int(info.st_size) == VaultLog.headerLength, "the reserve is beyond the end: the size holds the header")
        #expect(Int(info.st_blocks) * 512 >= Vault.reserveLength)
        let free = rig.disk.freeBytes
        try vault.save(changed: [Self.rotated(.sample("a"))], removed: [])
        #expect(rig.disk.freeBytes == free, "the record took no new block")
    }

    @Test func onAFullDiskSavesGoOnIntoTheReserveUntilEnsureRoomRefuses() throws {
        let rig = try Rig(kibibytes: 2048)
        defer { rig.remove() }
        var current = Dictionary(uniqueKeysWithValues: (0..<5).map { ("a\($0)", AccountRecord.sample("a\($0)")) })
        let refusal: VaultError? = try {
            let vault = try Vault(path: rig.path, key: rig.key)
            _ = try vault.load()
            try vault.save(VaultContents(accounts: current.values.sorted { $0.name < $1.name }))
            try vault.ensureRoom()
            try rig.disk.fill()
            let snapshot = FileManager.default.contents(atPath: rig.path)
            for index in 0..<100 {
                do {
                    try vault.ensureRoom()
                } catch let error as VaultError {
                    #expect(index >= 10, "dozens of KiB of records fit before it refuses")
                    #expect(FileManager.default.contents(atPath: rig.path) == snapshot, "no snapshot could be written")
                    return error
                }
                let record = Self.rotated(current["a\(index % 5)"]!, length: 8 * 1024)
                try vault.save(changed: [record], removed: [])
                current[record.name] = record
            }
            return nil
        }()
        let message = try #require(refusal?.description)
        #expect(message.contains("\(rig.logPath): No space left on device"))
        #expect(try rig.load() == current.values.sorted { $0.name < $1.name }, "every save that returned is kept")

        rig.disk.free()
        do {
            let vault = try Vault(path: rig.path, key: rig.key)
            _ = try vault.load()
            try vault.ensureRoom()
            let record = Self.rotated(current["a0"]!)
            try vault.save(changed: [record], removed: [])
            current[record.name] = record
        }
        #expect(try rig.load() == current.values.sorted { $0.name < $1.name }, "saves go on once there is room")
    }

    @Test func aRecordWhoseWriteFailedIsWrittenAgainInItsPlaceWhenNoSnapshotFits() throws {
        let rig = try Rig(kibibytes: 2048)
        defer { rig.remove() }
        // A snapshot of 400 KiB, so that none fits in what is left free below.
        var current = Dictionary(
            uniqueKeysWithValues: (0..<20).map { ("a\($0)", Self.rotated(.sample("a\($0)"), length: 20 * 1024)) })
        do {
            let vault = try Vault(path: rig.path, key: rig.key)
            _ = try vault.load()
            try vault.save(VaultContents(accounts: current.values.sorted { $0.name < $1.name }))
            try vault.ensureRoom()
            try rig.disk.fill()
            // Longer than the reserve: its write runs out of space halfway.
            let large = Self.rotated(current["a1"]!, length: Vault.reserveLength + 40 * 1024)
            let failed = #expect(throws: FileAccessError.self) { try vault.save(changed: [large], removed: []) }
            #expect(failed?.description.contains("\(rig.logPath): No space left on device") == true)
            rig.disk.free()
            try rig.disk.fill(leaving: 160 * 1024)
            let small = Self.rotated(current["a2"]!)
            try vault.save(changed: [small], removed: [])
            current[large.name] = large
            current[small.name] = small
        }
        #expect(try rig.load() == current.values.sorted { $0.name < $1.name })
    }
}
