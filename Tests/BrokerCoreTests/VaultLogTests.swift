@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// protocol/VAULT.md: a save writes what changed (one sealed record appended to the log beside the
/// snapshot), and every guarantee of the single-file vault stays: a torn end is the only thing
/// dropped, a changed, moved or repeated record is refused with every file left untouched, a
/// crash at any point of a compaction loads the latest saved state, and a vault in format 1
/// is converted on its first load.
@Suite struct VaultLogTests {
    /// A vault directory and its key.
    struct Rig {
        let directory: TemporaryDirectory
        let key: SecretKey
        var name = "vault"
        var path: String { directory.file(name) }
        var logPath: String { path + ".log" }
        var stagingPath: String { path + ".next" }

        init() throws {
            directory = try TemporaryDirectory()
            key = try VaultKey.load(path: directory.file("key"), create: true)
        }

        /// Another vault in the same directory, under the same key.
        init(beside other: Rig, name: String) {
            directory = other.directory
            key = other.key
            self.name = name
        }

        /// Opens and loads the vault as a starting broker does, runs `body` with it and what it
        /// loaded, then closes it (and so releases its lock).
        func withVault<Result>(_ body: (Vault, VaultContents?) throws -> Result) throws -> Result {
            let vault = try Vault(path: path, key: key)
            return try body(vault, try vault.load())
        }

        /// What a broker starting now would load.
        func load() throws -> [AccountRecord] { try withVault { $1?.accounts ?? [] } }

        /// The bytes of `file`, `nil` when it does not exist.
        func bytes(_ file: String) -> [UInt8]? { FileManager.default.contents(atPath: file).map { [UInt8]($0) } }

        /// Writes (or, for `nil`, removes) the vault's snapshot, log and staging file, mode 0600.
        func place(snapshot: [UInt8]?, log: [UInt8]?, staging: [UInt8]? = nil) throws {
            for (file, bytes) in [(path, snapshot), (logPath, log), (stagingPath, staging)] {
                try? FileManager.default.removeItem(atPath: file)
                guard let bytes else { continue }
                try Data(bytes).write(to: URL(fileURLWithPath: file))
                chmod(file, 0o600)
            }
        }
    }

    /// `count` accounts named `account-000`...
    static func accounts(_ count: Int) -> [AccountRecord] {
        (0..<count).map { .sample(String(format: "account-%03d", $0)) }
    }

    /// `record` with a new refresh token, as a refresh leaves it.
    static func rotated(_ record: AccountRecord) -> AccountRecord {
        var record = record
        record.secrets.refreshToken = try! SecretBytes("rt-rotated-\(UUID().uuidString)")
        return record
    }

    /// The byte ranges of the log's records, found by their length fields.
    static func records(in log: [UInt8]) -> [Range<Int>] {
        var ranges: [Range<Int>] = []
        var start = VaultLog.headerLength
        while start + VaultLog.recordPrefixLength <= log.count {
            let end = start + VaultLog.recordPrefixLength + Int(log.bigEndian(UInt32.self, at: start))
            guard end <= log.count else { break }
            ranges.append(start..<end)
            start = end
        }
        return ranges
    }

    /// A vault of 20 accounts saved whole (`snapshot`), then `changes` single-account changes
    /// (the accounts rotated in turn): the rig, the snapshot's accounts, and the accounts as
    /// they are now, by name.
    static func vaultWithLog(changes: Int) throws -> (Rig, snapshot: [AccountRecord], [String: AccountRecord]) {
        let rig = try Rig()
        let snapshot = accounts(20)
        var expected = Dictionary(uniqueKeysWithValues: snapshot.map { ($0.name, $0) })
        try rig.withVault { vault, _ in
            try vault.save(VaultContents(accounts: snapshot))
            for index in 0..<changes {
                let record = rotated(expected[name(index)]!)
                try vault.save(changed: [record], removed: [])
                expected[record.name] = record
            }
        }
        return (rig, snapshot, expected)
    }

    /// The name of one of the 20 accounts, counting round.
    static func name(_ index: Int) -> String { String(format: "account-%03d", index % 20) }

    static func sorted(_ accounts: [String: AccountRecord]) -> [AccountRecord] {
        accounts.values.sorted { $0.name < $1.name }
    }

    // MARK: Saves

    @Test func aChangeToOneAccountAppendsOneRecordAndLeavesTheSnapshotAlone() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let all = Self.accounts(200)
        let changed = Self.rotated(all[7])
        try rig.withVault { vault, empty in
            #expect(empty == nil)
            try vault.save(changed: all, removed: [])
            let snapshot = try #require(rig.bytes(rig.path))
            #expect(rig.bytes(rig.logPath) == nil, "the first save of a vault is a snapshot")

            try vault.save(changed: [changed], removed: [])
            let log = try #require(rig.bytes(rig.logPath))
            #expect(rig.bytes(rig.path) == snapshot, "the snapshot was not rewritten")
            #expect(Self.records(in: log).count == 1)
            #expect(log.count < 2_000, "one account's record, not the vault (\(log.count) bytes)")
            #expect(snapshot.count > 50 * log.count)
            #expect(!Data(log).contains(changed.secrets.refreshToken!.text), "no plaintext secret in the log")

            try vault.save(changed: [], removed: [all[3].name])
            #expect(Self.records(in: rig.bytes(rig.logPath)!).count == 2)
        }
        var expected = all
        expected[7] = changed
        expected.remove(at: 3)
        try rig.withVault { vault, contents in
            #expect(contents?.accounts == expected)
            #expect(!vault.recoveredInterruptedSave)
        }
    }

    @Test func changesAndRemovalsReplayInTheOrderTheyWereSaved() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let a = AccountRecord.sample("a")
        let a2 = Self.rotated(a)
        let b3 = Self.rotated(AccountRecord.sample("b"))
        try rig.withVault { vault, _ in
            try vault.save(changed: [a, .sample("b")], removed: [])
            try vault.save(changed: [a2], removed: [])
            try vault.save(changed: [], removed: ["b"])
            try vault.save(changed: [.sample("c"), .sample("b")], removed: [])
            try vault.save(changed: [b3], removed: ["c"])
            #expect(try vault.load() == VaultContents(accounts: [a2, b3]))
        }
        #expect(try rig.load() == [a2, b3])
    }

    @Test func aChangeBeforeTheVaultWasLoadedIsRefused() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let vault = try Vault(path: rig.path, key: rig.key)
        #expect(throws: VaultError.self) { try vault.save(changed: [.sample("a")], removed: []) }
        #expect(rig.bytes(rig.path) == nil)
    }

    @Test func theLogIsFoldedIntoANewSnapshotOnceItHasGrownLongEnough() throws {
        let (rig, _, saved) = try Self.vaultWithLog(changes: 0)
        defer { rig.directory.remove() }
        var current = saved
        var snapshots = 0
        var longest = 0
        try rig.withVault { vault, _ in
            for index in 0..<300 {
                let before = rig.bytes(rig.path)
                let record = Self.rotated(current[Self.name(index)]!)
                try vault.save(changed: [record], removed: [])
                current[record.name] = record
                longest = max(longest, rig.bytes(rig.logPath)?.count ?? 0)
                if rig.bytes(rig.path) != before {
                    snapshots += 1
                    #expect(rig.bytes(rig.logPath) == nil, "a new snapshot starts without a log")
                }
            }
        }
        #expect(snapshots >= 2)
        let bound = Vault.compactionLength(snapshotLength: rig.bytes(rig.path)!.count)
        #expect(longest < bound + 2_000, "the log never grows past the bound by more than a record")
        #expect(try rig.load() == Self.sorted(current))
    }

    // MARK: Crashes

    @Test(arguments: [1, 4, 8, 16, 30, VaultLog.recordPrefixLength, VaultLog.recordPrefixLength + 10, -1])
    func aRecordCutShortAtTheEndIsDroppedAndCutAway(cut: Int) throws {
        let (rig, _, saved) = try Self.vaultWithLog(changes: 3)
        defer { rig.directory.remove() }
        let log = try #require(rig.bytes(rig.logPath))
        let unsaved = Self.rotated(saved["account-005"]!)
        try rig.withVault { vault, _ in try vault.save(changed: [unsaved], removed: []) }
        let full = try #require(rig.bytes(rig.logPath))
        let kept = cut > 0 ? log.count + cut : full.count + cut
        #expect(kept > log.count && kept < full.count)
        try rig.place(snapshot: rig.bytes(rig.path), log: Array(full.prefix(kept)))

        try rig.withVault { vault, contents in
            #expect(contents?.accounts == Self.sorted(saved), "the save that never returned is dropped, nothing else")
            #expect(rig.bytes(rig.logPath) == log, "the torn end was cut away")
            // Saving goes on after the cut.
            try vault.save(changed: [unsaved], removed: [])
        }
        #expect(try rig.load().first { $0.name == unsaved.name } == unsaved)
    }

    @Test(arguments: [0, 1, 9, VaultLog.headerLength - 1, VaultLog.headerLength, VaultLog.headerLength + 20])
    func aLogCutShortWhileItWasStartedHoldsNothing(length: Int) throws {
        let (rig, snapshot, _) = try Self.vaultWithLog(changes: 1)
        defer { rig.directory.remove() }
        let log = try #require(rig.bytes(rig.logPath))
        try rig.place(snapshot: rig.bytes(rig.path), log: Array(log.prefix(length)))
        #expect(try rig.load() == snapshot)
        // Shorter than its header, it is removed; a whole header stays, a log of no record yet.
        let header = Array(log.prefix(VaultLog.headerLength))
        #expect(rig.bytes(rig.logPath) == (length < VaultLog.headerLength ? nil : header))
    }

    @Test func zerosAfterTheLastRecordEndTheLogAndAreCutAway() throws {
        let (rig, _, saved) = try Self.vaultWithLog(changes: 3)
        defer { rig.directory.remove() }
        let log = try #require(rig.bytes(rig.logPath))
        for zeros in [1, VaultLog.recordPrefixLength, 5000] {
            try rig.place(snapshot: rig.bytes(rig.path), log: log + [UInt8](repeating: 0, count: zeros))
            #expect(try rig.load() == Self.sorted(saved))
            #expect(rig.bytes(rig.logPath) == log)
        }
    }

    @Test func zerosFollowedByAnythingElseAreRefused() throws {
        let (rig, _, _) = try Self.vaultWithLog(changes: 3)
        defer { rig.directory.remove() }
        let log = try #require(rig.bytes(rig.logPath))
        let tampered = log + [UInt8](repeating: 0, count: 100) + [1]
        try rig.place(snapshot: rig.bytes(rig.path), log: tampered)
        let error = #expect(throws: VaultError.self) { try rig.load() }
        #expect(error?.description.contains("damaged length at record 3") == true)
        #expect(rig.bytes(rig.logPath) == tampered)
    }

    /// The instants of a compaction: the new snapshot staged (cut short at some byte, or
    /// whole), renamed with the old log still there, and the next log cut short while created.
    enum CompactionCrash: CaseIterable, Sendable {
        case stagingCutShort, stagingComplete, renamedBeforeTheOldLogWasRemoved, nextLogCutShort, nextLogComplete
    }

    @Test(arguments: CompactionCrash.allCases)
    func aCrashAtAnyPointOfACompactionLoadsTheLatestSavedState(crash: CompactionCrash) throws {
        let (rig, _, saved) = try Self.vaultWithLog(changes: 0)
        defer { rig.directory.remove() }
        // Save until a save writes a snapshot; keep the files just before and just after it.
        var current = saved
        var before: (snapshot: [UInt8], log: [UInt8], state: [String: AccountRecord])?
        var after: (snapshot: [UInt8], state: [String: AccountRecord])?
        try rig.withVault { vault, _ in
            var index = 0
            while after == nil {
                let files = (snapshot: rig.bytes(rig.path)!, log: rig.bytes(rig.logPath) ?? [], state: current)
                let record = Self.rotated(current[Self.name(index)]!)
                try vault.save(changed: [record], removed: [])
                current[record.name] = record
                if rig.bytes(rig.path)! != files.snapshot, !files.log.isEmpty {
                    before = files
                    after = (rig.bytes(rig.path)!, current)
                }
                index += 1
            }
            // One more save: the first record of the next log.
            let record = Self.rotated(current["account-019"]!)
            try vault.save(changed: [record], removed: [])
            current[record.name] = record
        }
        let old = try #require(before)
        let new = try #require(after)
        let nextLog = try #require(rig.bytes(rig.logPath))

        switch crash {
        case .stagingCutShort:
            for length in [0, 10, VaultSnapshot.headerLength, new.snapshot.count / 2, new.snapshot.count - 1] {
                try rig.place(snapshot: old.snapshot, log: old.log, staging: Array(new.snapshot.prefix(length)))
                #expect(try rig.load() == Self.sorted(old.state), "the compacting save never returned")
                #expect(rig.bytes(rig.stagingPath) == nil)
                #expect(rig.bytes(rig.path) == old.snapshot && rig.bytes(rig.logPath) == old.log)
            }
        case .stagingComplete:
            try rig.place(snapshot: old.snapshot, log: old.log, staging: new.snapshot)
            try rig.withVault { vault, contents in
                #expect(contents?.accounts == Self.sorted(new.state))
                #expect(vault.recoveredInterruptedSave)
            }
            #expect(rig.bytes(rig.path) == new.snapshot)
            #expect(rig.bytes(rig.logPath) == nil && rig.bytes(rig.stagingPath) == nil)
        case .renamedBeforeTheOldLogWasRemoved:
            try rig.place(snapshot: new.snapshot, log: old.log)
            #expect(try rig.load() == Self.sorted(new.state))
            #expect(rig.bytes(rig.logPath) == nil, "the superseded log is removed")
        case .nextLogCutShort:
            for length in [1, VaultLog.headerLength, nextLog.count - 1] {
                try rig.place(snapshot: new.snapshot, log: Array(nextLog.prefix(length)))
                #expect(try rig.load() == Self.sorted(new.state))
            }
        case .nextLogComplete:
            try rig.place(snapshot: new.snapshot, log: nextLog)
            #expect(try rig.load() == Self.sorted(current))
        }
    }

    // MARK: Tampering

    /// Places in a log of three records: the header's fields, and each field of the middle record.
    enum Spot: String, CaseIterable, Sendable {
        case magic, version, generation, snapshotNonce, headerNonce, headerTag
        case length, lengthCheck, sequence, nonce, ciphertext, tag
        case lastRecordLength, lastRecordTag

        func offset(in log: [UInt8]) -> Int {
            let records = VaultLogTests.records(in: log)
            let middle = records[1].lowerBound
            switch self {
            case .magic: return 2
            case .version: return 9
            case .generation: return 17
            case .snapshotNonce: return 30
            case .headerNonce: return 50
            case .headerTag: return VaultLog.headerLength - 1
            case .length: return middle + 3
            case .lengthCheck: return middle + 5
            case .sequence: return middle + 15
            case .nonce: return middle + 20
            case .ciphertext: return middle + VaultLog.recordPrefixLength + 5
            case .tag: return records[1].upperBound - 1
            case .lastRecordLength: return records[2].lowerBound + 1
            case .lastRecordTag: return log.count - 1
            }
        }
    }

    @Test(arguments: Spot.allCases, [UInt8(0x01), 0x80])
    func aChangedByteInTheLogIsRefusedAndEveryFileLeftUntouched(spot: Spot, mask: UInt8) throws {
        let (rig, _, saved) = try Self.vaultWithLog(changes: 3)
        defer { rig.directory.remove() }
        var log = try #require(rig.bytes(rig.logPath))
        #expect(Self.records(in: log).count == 3)
        log[spot.offset(in: log)] ^= mask
        try rig.place(snapshot: rig.bytes(rig.path), log: log)
        let snapshot = rig.bytes(rig.path)

        let error = #expect(throws: VaultError.self) { try rig.load() }
        #expect(error?.description.contains(rig.logPath) == true, "the message names the file")
        #expect(error?.description.contains("left untouched") == true)
        for record in saved.values {
            #expect(error?.description.contains(record.secrets.refreshToken!.text) == false)
        }
        #expect(rig.bytes(rig.logPath) == log && rig.bytes(rig.path) == snapshot)
    }

    /// Whole records moved about: none of these logs is one the vault wrote.
    enum Splice: CaseIterable, Sendable {
        case swapped, repeatedAtTheEnd, middleDropped, fromTheLogBefore, fromAnotherVaultWithTheSameKey

        /// What the refusal says: a record out of sequence, or one bound to another log.
        var reason: String {
            switch self {
            case .swapped, .repeatedAtTheEnd, .middleDropped: return "(moved or repeated)"
            case .fromTheLogBefore, .fromAnotherVaultWithTheSameKey: return "cannot be decrypted at record 1"
            }
        }
    }

    @Test(arguments: Splice.allCases)
    func aRecordMovedRepeatedDroppedOrBroughtFromElsewhereIsRefused(splice: Splice) throws {
        let (rig, _, saved) = try Self.vaultWithLog(changes: 3)
        defer { rig.directory.remove() }
        let log = try #require(rig.bytes(rig.logPath))
        let records = Self.records(in: log).map { Array(log[$0]) }
        let header = Array(log.prefix(VaultLog.headerLength))
        var snapshot = try #require(rig.bytes(rig.path))
        var tampered: [UInt8]
        switch splice {
        case .swapped: tampered = header + records[0] + records[2] + records[1]
        case .repeatedAtTheEnd: tampered = log + records[1]
        case .middleDropped: tampered = header + records[0] + records[2]
        case .fromTheLogBefore:
            // The next generation's log (one record) given the second record of the one before.
            try rig.withVault { vault, contents in
                try vault.save(contents!)
                try vault.save(changed: [Self.rotated(saved["account-000"]!)], removed: [])
            }
            snapshot = try #require(rig.bytes(rig.path))
            tampered = try #require(rig.bytes(rig.logPath)) + records[1]
        case .fromAnotherVaultWithTheSameKey:
            let other = Rig(beside: rig, name: "other")
            try other.withVault { vault, _ in
                try vault.save(VaultContents(accounts: Self.accounts(20)))
                for index in 0..<2 {
                    try vault.save(changed: [Self.rotated(saved[Self.name(index)]!)], removed: [])
                }
            }
            let otherLog = try #require(other.bytes(other.logPath))
            tampered = header + records[0] + Array(otherLog[Self.records(in: otherLog)[1]])
        }
        try rig.place(snapshot: snapshot, log: tampered)

        let error = #expect(throws: VaultError.self) { try rig.load() }
        #expect(error?.description.contains(splice.reason) == true)
        #expect(error?.description.contains("left untouched") == true)
        #expect(rig.bytes(rig.logPath) == tampered && rig.bytes(rig.path) == snapshot)
    }

    @Test func aLogBesideAnotherSnapshotOrUnderAnotherKeyIsRefused() throws {
        let (rig, _, _) = try Self.vaultWithLog(changes: 2)
        defer { rig.directory.remove() }
        let log = try #require(rig.bytes(rig.logPath))
        // The same accounts saved as a snapshot of the same generation in another vault.
        let other = Rig(beside: rig, name: "other")
        try Vault(path: other.path, key: rig.key).save(VaultContents(accounts: Self.accounts(20)))
        try rig.place(snapshot: other.bytes(other.path), log: log)
        let error = #expect(throws: VaultError.self) { try rig.load() }
        #expect(error?.description.contains("another snapshot") == true)
        #expect(rig.bytes(rig.logPath) == log)

        // Under another key, the header does not authenticate.
        let foreign = try Rig()
        defer { foreign.directory.remove() }
        try foreign.withVault { vault, _ in
            try vault.save(VaultContents(accounts: Self.accounts(2)))
            try vault.save(changed: [.sample("x")], removed: [])
        }
        try rig.place(snapshot: other.bytes(other.path), log: foreign.bytes(foreign.logPath))
        let refused = #expect(throws: VaultError.self) { try rig.load() }
        #expect(refused?.description.contains("the key is wrong or the file was modified") == true)
    }

    @Test func aLogWithoutItsSnapshotIsRefusedNotMistakenForAnEmptyVault() throws {
        let (rig, _, _) = try Self.vaultWithLog(changes: 1)
        defer { rig.directory.remove() }
        let log = rig.bytes(rig.logPath)
        try rig.place(snapshot: nil, log: log)
        let error = #expect(throws: VaultError.self) { try rig.load() }
        #expect(error?.description.contains(rig.logPath) == true)
        #expect(rig.bytes(rig.logPath) == log)
    }

    @Test func aLinkAtTheLogIsRefusedAndItsTargetUntouched() throws {
        let (rig, _, _) = try Self.vaultWithLog(changes: 1)
        defer { rig.directory.remove() }
        let victim = rig.directory.file("victim")
        try Data("not the broker's".utf8).write(to: URL(fileURLWithPath: victim))
        try FileManager.default.removeItem(atPath: rig.logPath)
        try FileManager.default.createSymbolicLink(atPath: rig.logPath, withDestinationPath: victim)
        let error = #expect(throws: FileAccessError.self) { try rig.load() }
        #expect(error?.description.contains("\(rig.logPath): it is a symbolic link") == true)
        #expect(FileManager.default.contents(atPath: victim) == Data("not the broker's".utf8))
    }

    // MARK: Format 1

    /// Writes `accounts` as the single-file vault of format 1 did: magic, version 1 and a nonce
    /// as the header, then the sealed JSON of the sequence number and every account.
    static func writeFormatOne(_ accounts: [AccountRecord], sequence: UInt64?, to path: String, key: SecretKey) throws {
        struct Stored: Codable {
            var sequence: UInt64?
            var accounts: [AccountRecord]
        }
        let plaintext = try JSONEncoder().encode(Stored(sequence: sequence, accounts: accounts))
        let nonce = Sodium.randomBytes(Sodium.nonceLength)
        let header = Array("TKBVAULT".utf8) + [0, 1] + nonce
        var file = Data(header)
        file.append(Sodium.seal(plaintext, associatedData: header, nonce: nonce, key: key))
        try file.write(to: URL(fileURLWithPath: path))
        chmod(path, 0o600)
    }

    @Test(arguments: [UInt64?.none, 1, 41])
    func aFormatOneVaultIsConvertedOnItsFirstLoad(sequence: UInt64?) throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let saved = Self.accounts(30)
        try Self.writeFormatOne(saved, sequence: sequence, to: rig.path, key: rig.key)
        let changed = Self.rotated(saved[4])

        let converted = try rig.withVault { vault, contents in
            #expect(contents?.accounts == saved)
            #expect(vault.convertedFormatVersion == 1)
            let converted = try #require(rig.bytes(rig.path))
            #expect(converted.bigEndian(UInt16.self, at: 8) == VaultSnapshot.formatVersion)
            let snapshot = try VaultSnapshot.open(converted, path: rig.path, key: rig.key)
            #expect(snapshot.generation == (sequence ?? 0) + 1, "generations go on from the old sequence")
            // Changes are appended from then on.
            try vault.save(changed: [changed], removed: [])
            #expect(rig.bytes(rig.path) == converted)
            return converted
        }
        var expected = saved
        expected[4] = changed
        try rig.withVault { vault, contents in
            #expect(vault.convertedFormatVersion == nil, "nothing left to convert")
            #expect(contents?.accounts == expected)
        }
        #expect(rig.bytes(rig.path) == converted)
    }

    @Test func aFormatOneSaveACrashInterruptedIsCompletedThenConverted() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let older = Self.accounts(3)
        var newer = older
        newer[1] = Self.rotated(older[1])
        try Self.writeFormatOne(older, sequence: 8, to: rig.path, key: rig.key)
        try Self.writeFormatOne(newer, sequence: 9, to: rig.stagingPath, key: rig.key)

        try rig.withVault { vault, contents in
            #expect(contents?.accounts == newer)
            #expect(vault.recoveredInterruptedSave)
            #expect(vault.convertedFormatVersion == 1)
        }
        #expect(rig.bytes(rig.stagingPath) == nil)
        #expect(try VaultSnapshot.open(rig.bytes(rig.path)!, path: rig.path, key: rig.key).generation == 10)
    }

    @Test func aCrashDuringTheConversionLoadsTheSameAccounts() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let saved = Self.accounts(3)
        try Self.writeFormatOne(saved, sequence: 5, to: rig.path, key: rig.key)
        let original = try #require(rig.bytes(rig.path))
        #expect(try rig.load() == saved)
        let converted = try #require(rig.bytes(rig.path))

        // Killed before the rename: the old file, and the new one staged (cut short or whole).
        for staged in [Array(converted.prefix(converted.count / 2)), converted] {
            try rig.place(snapshot: original, log: nil, staging: staged)
            #expect(try rig.load() == saved)
            #expect(rig.bytes(rig.path)!.bigEndian(UInt16.self, at: 8) == VaultSnapshot.formatVersion)
            #expect(rig.bytes(rig.stagingPath) == nil)
        }
    }
}
