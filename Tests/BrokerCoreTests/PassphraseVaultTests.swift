@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// Passphrase mode in the vault: a format 3 header naming the Argon2id derivation, a vault
/// that opens only with its passphrase and never holds it or its key, and a rekey that leaves
/// files the old or the new key opens whichever step a crash interrupts. Serialized: its tests
/// wait on the same derivations, and would hold every thread of the test run while they do.
@Suite(.serialized) struct PassphraseVaultTests {
    /// Keys derived once for the whole suite (each derivation takes a second and 256 MiB).
    static let passphrase = "correct horse battery staple"
    static let right = try! PassphraseKey.derive(Array(passphrase.utf8), with: .fresh())
    /// Another passphrase under the very salt and limits of `right`: what a wrong unlock derives.
    static let wrong = try! PassphraseKey.derive(Array("incorrect horse".utf8), with: right.derivation)
    static let other = try! PassphraseKey.derive(Array("another passphrase".utf8), with: .fresh())

    private func contents() -> VaultContents {
        VaultContents(accounts: [.sample("api"), .sample("git")])
    }

    private func bytes(_ path: String) -> Data { FileManager.default.contents(atPath: path) ?? Data() }

    @Test func theFirstUnlockSetsThePassphraseAndOnlyThatPassphraseOpensTheVault() async throws {
        try await onOwnThread {
            let directory = try TemporaryDirectory()
            defer { directory.remove() }
            let path = directory.file("state/vault")
            let vault = try Vault(path: path)
            #expect(vault.isLocked)
            #expect(try vault.sealing() == nil)
            #expect(try vault.passphraseDerivation().isNew)
            #expect(throws: VaultError.self) { try vault.load() }

            #expect(try vault.unlock(with: Self.right) == nil, "no vault yet: created, empty")
            #expect(try vault.sealing() == .passphrase)
            let header = [UInt8](bytes(path).prefix(VaultSnapshot.passphraseHeaderLength))
            #expect(header.bigEndian(UInt16.self, at: 8) == VaultSnapshot.passphraseVersion)
            #expect(KeyDerivation.read(header, at: 10) == Self.right.derivation)
            #expect(try vault.passphraseDerivation().derivation == Self.right.derivation)
            #expect(Self.right.derivation.passes >= 3 && Self.right.derivation.memory >= 256 << 20)

            let saved = contents()
            try vault.save(saved)
            var changed = saved.accounts[0]
            changed.secrets.refreshToken = "rt-rotated-into-the-log"
            try vault.save(changed: [changed], removed: [])
            vault.lock()
            #expect(vault.isLocked)
            #expect(throws: VaultError.self) { try vault.save(changed: [changed], removed: []) }

            let before = (bytes(path), bytes(path + ".log"))
            let refusal = #expect(throws: VaultError.self) { try vault.unlock(with: Self.wrong) }
            #expect(refusal?.wrongKey == true)
            #expect(vault.isLocked, "a wrong key is not kept")
            #expect(bytes(path) == before.0 && bytes(path + ".log") == before.1, "the files were left untouched")

            let reopened = try #require(try vault.unlock(with: Self.right))
            #expect(reopened.accounts == [changed, saved.accounts[1]])

            // Neither the passphrase nor the key it derives is ever written.
            let key = Self.right.key.withBytes { Data(UnsafeBufferPointer(start: $0, count: Sodium.keyLength)) }
            for file in [bytes(path), bytes(path + ".log")] {
                #expect(!file.isEmpty)
                // Checked outside #expect, whose failure message would print the secret.
                let (passphraseWritten, keyWritten) = (file.contains(Self.passphrase), file.range(of: key) != nil)
                #expect(!passphraseWritten && !keyWritten, "the passphrase or its key in the vault")
                #expect(!file.contains("rt-rotated-into-the-log"))
            }
        }
    }

    @Test func aHeaderNamingOtherLimitsOrAChangedSaltIsRefused() async throws {
        try await onOwnThread {
            let directory = try TemporaryDirectory()
            defer { directory.remove() }
            let path = directory.file("vault")
            _ = try Vault(path: path).unlock(with: Self.right)
            let good = [UInt8](bytes(path))

            // Limits outside moderate...sensitive: refused before anything is derived.
            for (offset, value) in [(11, UInt64(1)), (11, UInt64(1_000)), (19, UInt64(8 << 20)), (19, UInt64(1) << 40)]
            {
                var planted = good
                var field: [UInt8] = []
                field.append(bigEndian: value)
                planted.replaceSubrange(offset..<(offset + 8), with: field)
                try Data(planted).write(to: URL(fileURLWithPath: path))
                let error = #expect(throws: VaultError.self) { try Vault(path: path).passphraseDerivation() }
                #expect(error?.description.contains("key derivation") == true)
            }
            // A salt changed by one bit no longer authenticates: the header is bound to the ciphertext.
            var salted = good
            salted[30] ^= 1
            try Data(salted).write(to: URL(fileURLWithPath: path))
            let error = #expect(throws: VaultError.self) { try Vault(path: path).unlock(with: Self.right) }
            #expect(error?.wrongKey == true)
            #expect(bytes(path) == Data(salted), "left untouched")
        }
    }

    @Test func theConfiguredModeNeverDropsAPassphraseAndAPassphraseVaultNeedsNoKeyFile() async throws {
        try await onOwnThread {
            let directory = try TemporaryDirectory()
            defer { directory.remove() }
            let keyFile = KeyFile(path: directory.file("config/vault.key"), isCredential: false)
            let path = directory.file("state/vault")
            do {
                let vault = try Vault(path: path, keyFile: keyFile)
                #expect(try vault.prepareKey(configured: .passphrase) == .passphrase)
                #expect(vault.isLocked)
                #expect(!FileManager.default.fileExists(atPath: keyFile.path), "no key file for a passphrase")
                #expect(try vault.prepareKey(configured: .keyFile) == .keyFile)
                #expect(!vault.isLocked)
                try vault.save(contents())
            }
            do {
                let vault = try Vault(path: path, keyFile: keyFile)
                let error = #expect(throws: VaultError.self) { try vault.prepareKey(configured: .passphrase) }
                #expect(error?.description.contains("sealed with the key file") == true)
                #expect(vault.isLocked)
            }
            let other = directory.file("other/vault")
            _ = try Vault(path: other).unlock(with: Self.right)
            let unused = KeyFile(path: directory.file("other/vault.key"), isCredential: false)
            let vault = try Vault(path: other, keyFile: unused)
            #expect(try vault.prepareKey(configured: .keyFile) == .passphrase, "the header decides")
            #expect(vault.isLocked)
            #expect(!FileManager.default.fileExists(atPath: unused.path))
        }
    }

    /// A rekey and the step a crash stops it after.
    struct Interruption: Sendable, CustomTestStringConvertible {
        enum Direction: String, Sendable { case keyFileToPassphrase, passphraseToKeyFile, passphraseToPassphrase }
        let direction: Direction
        /// `nil`: the rekey runs to its end.
        let step: Vault.RekeyStep?

        var testDescription: String { "\(direction.rawValue) stopped after \(step.map { "\($0)" } ?? "nothing")" }

        static let all: [Interruption] =
            [Direction.keyFileToPassphrase, .passphraseToKeyFile, .passphraseToPassphrase].flatMap { direction in
                let steps = Vault.RekeyStep.allCases.filter { step in
                    switch step {
                    case .keyFileWritten: return direction == .passphraseToKeyFile
                    case .keyFileRemoved: return direction == .keyFileToPassphrase
                    default: return true
                    }
                }
                return (steps.map(Optional.some) + [nil]).map { Interruption(direction: direction, step: $0) }
            }
    }

    /// Stops a rekey where a crash would.
    struct Crash: Error {}

    @Test(arguments: Interruption.all)
    func aRekeyStoppedAfterAnyStepLeavesFilesTheOldOrTheNewKeyOpens(_ interruption: Interruption) async throws {
        try await onOwnThread {
            let directory = try TemporaryDirectory()
            defer { directory.remove() }
            let keyFile = KeyFile(path: directory.file("config/vault.key"), isCredential: false)
            let path = directory.file("state/vault")
            let target: Vault.Rekey =
                interruption.direction == .passphraseToKeyFile
                ? .keyFile : .passphrase(interruption.direction == .keyFileToPassphrase ? Self.right : Self.other)
            let (old, expected) = try Self.rekey(path, keyFile: keyFile, interruption, to: target)
            let renamed = interruption.step.map { [.renamed, .keyFileRemoved].contains($0) } ?? true
            let new: SealingKey?
            switch target {
            case .keyFile: new = (try? VaultKey.load(path: keyFile.path, create: false)).map(SealingKey.keyFile)
            case .passphrase(let key): new = .passphrase(key)
            }
            // The key that must fail is tried first: a successful load settles the files.
            if renamed {
                #expect(throws: VaultError.self) { try Self.open(path, with: old) }
                #expect(try Self.open(path, with: try #require(new)) == expected)
            } else {
                if let new { #expect(throws: VaultError.self) { try Self.open(path, with: new) } }
                #expect(try Self.open(path, with: old) == expected)
            }

            let keyFileThere = FileManager.default.fileExists(atPath: keyFile.path)
            switch interruption.direction {
            case .keyFileToPassphrase:
                #expect(keyFileThere == (interruption.step != nil && interruption.step != .keyFileRemoved))
            case .passphraseToKeyFile: #expect(keyFileThere == (interruption.step != .compacted))
            case .passphraseToPassphrase: #expect(!keyFileThere)
            }
            if interruption.step == nil {
                #expect(!FileManager.default.fileExists(atPath: path + ".log"), "the old key's log is gone")
                #expect(!FileManager.default.fileExists(atPath: path + ".next"))
            }
        }
    }

    /// Fills a vault at `path` under the old key of `interruption` (a snapshot, and a log
    /// continuing it), then rekeys it to `target`, stopping where `interruption` says; returns
    /// the old key and what the vault held. The vault object is gone on return, as after a crash.
    private static func rekey(
        _ path: String, keyFile: KeyFile, _ interruption: Interruption, to target: Vault.Rekey
    ) throws -> (SealingKey, VaultContents?) {
        let vault = try Vault(path: path, keyFile: keyFile)
        let old: SealingKey
        if interruption.direction == .keyFileToPassphrase {
            _ = try vault.prepareKey(configured: .keyFile)
            old = .keyFile(try VaultKey.load(path: keyFile.path, create: false))
        } else {
            _ = try vault.unlock(with: right)
            old = .passphrase(right)
        }
        try vault.save(VaultContents(accounts: [.sample("api"), .sample("git")]))
        var changed = try #require(try vault.load()).accounts[1]
        changed.secrets.refreshToken = "rt-in-the-log"
        try vault.save(changed: [changed], removed: ["api"])
        #expect(FileManager.default.fileExists(atPath: path + ".log"))
        let expected = try vault.load()
        do {
            _ = try vault.rekey(to: target) { step in if step == interruption.step { throw Crash() } }
            #expect(interruption.step == nil)
        } catch is Crash {
            #expect(interruption.step != nil)
        }
        return (old, expected)
    }

    /// What the vault at `path` holds, read with `key` by a vault object of its own.
    private static func open(_ path: String, with key: SealingKey) throws -> VaultContents? {
        switch key {
        case .keyFile(let key): return try Vault(path: path, key: key).load()
        case .passphrase(let key): return try Vault(path: path).unlock(with: key)
        }
    }

    @Test func aRekeyFromThePassphraseReusesAKeyFileThatIsThereAndARekeyToItAgainIsRefused() async throws {
        try await onOwnThread {
            let directory = try TemporaryDirectory()
            defer { directory.remove() }
            let keyFile = KeyFile(path: directory.file("vault.key"), isCredential: false)
            let existing = try VaultKey.load(path: keyFile.path, create: true)
            let vault = try Vault(path: directory.file("vault"), keyFile: keyFile)
            _ = try vault.unlock(with: Self.right)
            let saved = contents()
            try vault.save(saved)
            #expect(try vault.rekey(to: .keyFile) == nil)
            #expect(vault.keyMode == .keyFile)
            #expect(try Self.open(vault.path + "-copy", copying: vault.path, with: .keyFile(existing)) == saved)
            #expect(throws: VaultError.self) { try vault.rekey(to: .keyFile) }
        }
    }

    @Test func aKeyFileThatIsASystemdCredentialIsLeftAndNamed() async throws {
        try await onOwnThread {
            let directory = try TemporaryDirectory()
            defer { directory.remove() }
            let keyPath = directory.file("credentials/vault-key")
            _ = try VaultKey.load(path: keyPath, create: true)
            let vault = try Vault(path: directory.file("vault"), keyFile: KeyFile(path: keyPath, isCredential: true))
            #expect(try vault.prepareKey(configured: .keyFile) == .keyFile)
            try vault.save(contents())
            #expect(try vault.rekey(to: .passphrase(Self.right)) == keyPath)
            #expect(FileManager.default.fileExists(atPath: keyPath))
            #expect(try vault.sealing() == .passphrase)
        }
    }

    /// What a copy of the vault at `source` (snapshot and log) holds, read with `key`.
    private static func open(_ path: String, copying source: String, with key: SealingKey) throws -> VaultContents? {
        try copyVault(from: source, to: path)
        return try open(path, with: key)
    }
}
