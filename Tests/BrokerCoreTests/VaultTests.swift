@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// protocol/VAULT.md: one encrypted vault, refused (and left alone) when the key is wrong or a
/// byte was changed; one broker per vault; a private key file.
@Suite struct VaultTests {
    private func contents() -> VaultContents {
        var needsLogin = AccountRecord.sample("needs-login")
        needsLogin.needsLogin = true
        needsLogin.token = nil
        let staticAccount = AccountRecord(
            name: "static", provider: ProviderConfig(StaticSettings()), secrets: AccountSecrets(), token: nil,
            needsLogin: false, lastError: nil,
            lastRefreshAt: nil)
        return VaultContents(accounts: [.sample("api"), needsLogin, staticAccount])
    }

    @Test func saveThenLoadGivesBackEveryRecordWithoutPlaintextOnDisk() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let vault = try Vault(
            path: directory.file("state/vault"), key: VaultKey.load(path: directory.file("key"), create: true))
        #expect(try vault.load() == nil, "no file yet means an empty vault")

        let saved = contents()
        try vault.save(saved)
        #expect(try vault.load() == saved)

        let bytes = try Data(contentsOf: URL(fileURLWithPath: vault.path))
        #expect(bytes.prefix(8) == Data("TKBVAULT".utf8))
        for record in saved.accounts {
            for secret in [
                record.secrets.refreshToken?.text, record.secrets.clientSecret?.text, record.token?.value.text,
            ] {
                if let secret { #expect(!bytes.contains(secret), "plaintext secret in the vault file") }
            }
        }
        #expect(!directory.contents.contains { $0.hasSuffix(".next") }, "no staging file left behind")
    }

    @Test func eachSaveReplacesTheWholeFileUnderAFreshNonce() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let vault = try Vault(
            path: directory.file("vault"), key: VaultKey.load(path: directory.file("key"), create: true))
        let saved = contents()
        try vault.save(saved)
        let first = try Data(contentsOf: URL(fileURLWithPath: vault.path))
        try vault.save(saved)
        let second = try Data(contentsOf: URL(fileURLWithPath: vault.path))
        #expect(first.count == second.count)
        #expect(first.subdata(in: 10..<34) != second.subdata(in: 10..<34), "nonce reused")

        let smaller = VaultContents(accounts: [saved.accounts[2]])
        try vault.save(smaller)
        #expect(try vault.load() == smaller)
    }

    /// Offsets into the file: magic, version, first and last nonce byte, ciphertext, last tag byte.
    enum Spot: String, CaseIterable, Sendable {
        case magic, version, nonceFirst, nonceLast, ciphertextFirst, ciphertextMiddle, tagFirst, tagLast

        func offset(fileLength: Int) -> Int {
            let header = VaultSnapshot.headerLength
            let tag = Sodium.tagLength
            switch self {
            case .magic: return 3
            case .version: return 9
            case .nonceFirst: return 10
            case .nonceLast: return header - 1
            case .ciphertextFirst: return header
            case .ciphertextMiddle: return (header + fileLength - tag) / 2
            case .tagFirst: return fileLength - tag
            case .tagLast: return fileLength - 1
            }
        }
    }

    @Test(arguments: Spot.allCases, [UInt8(0x01), 0x80])
    func aFlippedByteIsRefusedAndTheFileIsLeftUntouched(spot: Spot, mask: UInt8) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let vault = try Vault(
            path: directory.file("vault"), key: VaultKey.load(path: directory.file("key"), create: true))
        let saved = contents()
        try vault.save(saved)

        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: vault.path)))
        let offset = spot.offset(fileLength: bytes.count)
        #expect(offset > 0 && offset < bytes.count)
        bytes[offset] ^= mask
        let tampered = Data(bytes)
        try tampered.write(to: URL(fileURLWithPath: vault.path))

        let error = #expect(throws: VaultError.self) { try vault.load() }
        #expect(error?.description.contains(vault.path) == true, "the message names the file")
        for record in saved.accounts {
            #expect(error?.description.contains(record.secrets.refreshToken?.text ?? "<none>") == false)
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: vault.path)) == tampered, "the file was modified")
    }

    @Test func aTruncatedFileIsRefused() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let vault = try Vault(
            path: directory.file("vault"), key: VaultKey.load(path: directory.file("key"), create: true))
        try vault.save(contents())
        let bytes = try Data(contentsOf: URL(fileURLWithPath: vault.path))
        for length in [
            0, 7, VaultSnapshot.headerLength, VaultSnapshot.headerLength + Sodium.tagLength, bytes.count - 1,
        ] {
            let truncated = bytes.prefix(length)
            try truncated.write(to: URL(fileURLWithPath: vault.path))
            #expect(throws: VaultError.self, "length \(length)") { try vault.load() }
            #expect(try Data(contentsOf: URL(fileURLWithPath: vault.path)) == truncated)
        }
    }

    /// The files a save killed between writing its staging file and the rename leaves behind:
    /// the vault holds state `older` (saved first) and the staging file state `newer`.
    private func interruptedSave(in directory: TemporaryDirectory, older: VaultContents, newer: VaultContents) throws
        -> (vault: String, staging: String)
    {
        let path = directory.file("vault")
        let staging = path + ".next"
        let writer = try Vault(path: path, key: VaultKey.load(path: directory.file("key"), create: true))
        try writer.save(older)
        try FileManager.default.copyItem(atPath: path, toPath: directory.file("older"))
        try writer.save(newer)
        try FileManager.default.moveItem(atPath: path, toPath: staging)
        try FileManager.default.moveItem(atPath: directory.file("older"), toPath: path)
        return (path, staging)
    }

    @Test func aSaveInterruptedAfterItsStagingWriteIsCompletedAtLoad() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var newer = contents()
        newer.accounts[0].secrets.refreshToken = try! SecretBytes("rt-rotated-\(UUID().uuidString)")
        let (path, staging) = try interruptedSave(in: directory, older: contents(), newer: newer)

        let reader = try Vault(path: path, key: VaultKey.load(path: directory.file("key"), create: false))
        #expect(try reader.load() == newer)
        #expect(reader.recoveredInterruptedSave)
        #expect(!FileManager.default.fileExists(atPath: staging), "promoted to the vault")
        #expect(try reader.load() == newer)
        #expect(!reader.recoveredInterruptedSave)
        // Later saves keep counting from the recovered state.
        let later = contents()
        try reader.save(later)
        #expect(try reader.load() == later)
    }

    @Test func aStagingFileThatIsTornForeignOrOlderIsIgnored() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var newer = contents()
        newer.accounts[0].secrets.refreshToken = "rt-rotated"
        let older = contents()
        let (path, staging) = try interruptedSave(in: directory, older: older, newer: newer)
        let stagedBytes = try Data(contentsOf: URL(fileURLWithPath: staging))
        let olderBytes = try Data(contentsOf: URL(fileURLWithPath: path))
        let key = try VaultKey.load(path: directory.file("key"), create: false)
        /// What a broker starting now would load (each opening takes and releases the lock).
        func load() throws -> (VaultContents?, recovered: Bool) {
            let reader = try Vault(path: path, key: key)
            return (try reader.load(), reader.recoveredInterruptedSave)
        }

        // Torn: a kill in the middle of the staging write.
        try stagedBytes.prefix(stagedBytes.count / 2).write(to: URL(fileURLWithPath: staging))
        #expect(try load() == (older, false))
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == olderBytes, "vault untouched")

        // Sealed under another key.
        let foreign = try Vault(
            path: directory.file("other/vault"), key: VaultKey.load(path: directory.file("other-key"), create: true))
        for _ in 0..<3 { try foreign.save(newer) }
        try Data(contentsOf: URL(fileURLWithPath: foreign.path)).write(to: URL(fileURLWithPath: staging))
        #expect(try load() == (older, false))

        // Same key, newer, but not the very next save (left over from before a downgrade, say).
        let skipping = try Vault(path: directory.file("skip/vault"), key: key)
        for _ in 0..<3 { try skipping.save(newer) }
        try Data(contentsOf: URL(fileURLWithPath: skipping.path)).write(to: URL(fileURLWithPath: staging))
        #expect(try load() == (older, false))
        #expect(!FileManager.default.fileExists(atPath: staging), "a staging file not promoted is deleted")

        // Older than the vault: the vault holds the newer state, the staging file the older one.
        try stagedBytes.write(to: URL(fileURLWithPath: path))
        try olderBytes.write(to: URL(fileURLWithPath: staging))
        #expect(try load() == (newer, false))
    }

    @Test func aDifferentKeyIsRefusedAndTheFileIsLeftUntouched() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let writer = try Vault(
            path: directory.file("a/vault"), key: VaultKey.load(path: directory.file("key-a"), create: true))
        let saved = contents()
        try writer.save(saved)
        try FileManager.default.createDirectory(atPath: directory.file("b"), withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: writer.path, toPath: directory.file("b/vault"))
        let original = try Data(contentsOf: URL(fileURLWithPath: writer.path))

        let reader = try Vault(
            path: directory.file("b/vault"), key: VaultKey.load(path: directory.file("key-b"), create: true))
        let error = #expect(throws: VaultError.self) { try reader.load() }
        #expect(error?.description.contains("key is wrong") == true)
        #expect(try Data(contentsOf: URL(fileURLWithPath: reader.path)) == original)

        // The right key, loaded again from its file, still opens the copy.
        let again = try Vault(
            path: directory.file("c/vault"), key: VaultKey.load(path: directory.file("key-a"), create: false))
        try FileManager.default.copyItem(atPath: writer.path, toPath: again.path)
        #expect(try again.load() == saved)
    }

    @Test func aSecondVaultOnTheSamePathIsRefusedWhileTheFirstIsOpen() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let key = try VaultKey.load(path: directory.file("key"), create: true)
        let path = directory.file("vault")
        do {
            let first = try Vault(path: path, key: key)
            let error = #expect(throws: VaultError.self) { try Vault(path: path, key: key) }
            #expect(error?.description.contains("another brokerd") == true)
            withExtendedLifetime(first) {}
        }
        // Once the first is gone, the lock is free again.
        _ = try Vault(path: path, key: key)
    }

    /// A child forked while a vault was open, still running when the vault is closed, must not
    /// keep its lock: every process brokerd or a test spawns is such a child until its exec.
    @Test func aChildForkedWhileAVaultWasOpenDoesNotKeepItsLock() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let key = try VaultKey.load(path: directory.file("key"), create: true)
        let path = directory.file("vault")
        var first: Vault? = try Vault(path: path, key: key)
        // The child only waits to be killed: after a fork, a multithreaded process's child may
        // call nothing but async-signal-safe functions.
        let child = fork()
        if child == 0 { while true { pause() } }
        try #require(child > 0)
        defer {
            kill(child, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(child, &status, 0)
        }
        withExtendedLifetime(first) {}
        first = nil
        let again = try Vault(path: path, key: key)
        withExtendedLifetime(again) {}
    }

    @Test func theKeyFileIsCreatedPrivateAndReadBackAsTheSameKey() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let keyPath = directory.file("config/tokenbroker/vault.key")
        #expect(throws: VaultError.self) { try VaultKey.load(path: keyPath, create: false) }

        let key = try VaultKey.load(path: keyPath, create: true)
        let attributes = try FileManager.default.attributesOfItem(atPath: keyPath)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        #expect((attributes[.size] as? NSNumber)?.intValue == 32)
        let directoryAttributes = try FileManager.default.attributesOfItem(atPath: directory.file("config/tokenbroker"))
        #expect((directoryAttributes[.posixPermissions] as? NSNumber)?.intValue == 0o700)

        let keyBytes = try Data(contentsOf: URL(fileURLWithPath: keyPath))
        let again = try VaultKey.load(path: keyPath, create: true)
        #expect(try Data(contentsOf: URL(fileURLWithPath: keyPath)) == keyBytes, "an existing key is never replaced")

        let writer = try Vault(path: directory.file("w/vault"), key: key)
        let saved = contents()
        try writer.save(saved)
        let reader = try Vault(path: directory.file("r/vault"), key: again)
        try FileManager.default.copyItem(atPath: writer.path, toPath: reader.path)
        #expect(try reader.load() == saved)
    }

    @Test(arguments: [0, 16, 31, 33, 64])
    func aKeyFileOfTheWrongLengthIsRefused(length: Int) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let keyPath = directory.file("key")
        try Data(repeating: 7, count: length).write(to: URL(fileURLWithPath: keyPath))
        chmod(keyPath, 0o600)
        #expect(throws: VaultError.self) { try VaultKey.load(path: keyPath, create: true) }
        #expect(try Data(contentsOf: URL(fileURLWithPath: keyPath)) == Data(repeating: 7, count: length))
    }
}

extension TemporaryDirectory {
    /// Every name below the directory, recursively.
    var contents: [String] { (try? FileManager.default.subpathsOfDirectory(atPath: path)) ?? [] }
}
