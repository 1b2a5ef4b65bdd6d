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

/// The files beside the vault (docs/security.md, "Files and the vault at rest"). A planted link is
/// never followed (its target stays untouched); a key file or vault that others can read or write,
/// or that another uid owns, is refused with the `chmod` that fixes it; the vault's directory must
/// be private.
@Suite struct FileSafetyTests {
    /// Who owns the "other user's" files below; changing owners needs root.
    static let otherUID: uid_t = 65534
    static let isRoot = getuid() == 0

    /// A directory with a key and an empty vault, and a file outside it that links point to.
    private struct Rig {
        let directory: TemporaryDirectory
        let key: SecretKey
        var vaultPath: String { directory.file("state/vault") }
        var keyPath: String { directory.file("key") }
        var victim: String { directory.file("victim") }
        static let victimBytes = Data("precious, not the broker's\n".utf8)

        init() throws {
            directory = try TemporaryDirectory()
            key = try VaultKey.load(path: directory.file("key"), create: true)
            try Self.victimBytes.write(to: URL(fileURLWithPath: victim))
        }

        var victimIsUntouched: Bool { FileManager.default.contents(atPath: victim) == Self.victimBytes }
    }

    private static let saved = VaultContents(accounts: [.sample("api")])

    // MARK: Links

    @Test func aLinkPlantedAtTheStagingFileIsReplacedNotFollowed() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let vault = try Vault(path: rig.vaultPath, key: rig.key)
        try FileManager.default.createSymbolicLink(atPath: vault.stagingPath, withDestinationPath: rig.victim)

        try vault.save(Self.saved)

        #expect(rig.victimIsUntouched)
        #expect(Self.isRegularFile(vault.path))
        #expect(!FileManager.default.fileExists(atPath: vault.stagingPath))
        #expect(try vault.load() == Self.saved)
    }

    @Test func aLinkPlantedAtTheStagingFileIsDeletedAtLoadNotFollowed() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        try Vault(path: rig.vaultPath, key: rig.key).save(Self.saved)
        let staging = rig.vaultPath + ".next"
        try FileManager.default.createSymbolicLink(atPath: staging, withDestinationPath: rig.victim)

        let vault = try Vault(path: rig.vaultPath, key: rig.key)
        #expect(try vault.load() == Self.saved)
        #expect(!vault.recoveredInterruptedSave)
        #expect(rig.victimIsUntouched)
        #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: staging)) == nil, "the link is gone")
    }

    @Test func aLinkAtTheVaultIsRefused() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        try FileManager.default.createDirectory(atPath: rig.directory.file("state"), withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: rig.vaultPath, withDestinationPath: rig.victim)
        let vault = try Vault(path: rig.vaultPath, key: rig.key)

        let error = #expect(throws: FileAccessError.self) { try vault.load() }
        #expect(error?.description.contains("\(rig.vaultPath): it is a symbolic link") == true)
        #expect(rig.victimIsUntouched)
    }

    @Test func aLinkAtTheLockFileIsRefusedAndItsTargetUntouched() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        try FileManager.default.createDirectory(atPath: rig.directory.file("state"), withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: rig.vaultPath + ".lock", withDestinationPath: rig.victim)

        let error = #expect(throws: FileAccessError.self) { try Vault(path: rig.vaultPath, key: rig.key) }
        #expect(error?.description.contains("vault lock") == true)
        #expect(rig.victimIsUntouched)
    }

    @Test func aLinkAtTheKeyFileIsRefused() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let link = rig.directory.file("linked-key")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: rig.keyPath)

        let error = #expect(throws: FileAccessError.self) { try VaultKey.load(path: link, create: true) }
        #expect(error?.description.contains("\(link): it is a symbolic link") == true)
    }

    @Test func aDanglingLinkAtANewKeyFileIsNotFollowedToCreateOne() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let link = rig.directory.file("new-key")
        let target = rig.directory.file("created-through-the-link")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: target)

        #expect(throws: FileAccessError.self) { try VaultKey.load(path: link, create: true) }
        #expect(!FileManager.default.fileExists(atPath: target))
    }

    // MARK: Modes and owners

    @Test(arguments: [0o644, 0o640, 0o604, 0o620, 0o602, 0o666])
    func aKeyFileOthersCanReadOrWriteIsRefusedWithTheChmodThatFixesIt(mode: Int) throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        chmod(rig.keyPath, mode_t(mode))

        let error = #expect(throws: FileAccessError.self) { try VaultKey.load(path: rig.keyPath, create: true) }
        #expect(error?.description.contains(rig.keyPath) == true)
        #expect(error?.description.contains("chmod 600 \(rig.keyPath)") == true)

        chmod(rig.keyPath, 0o600)
        #expect(throws: Never.self) { try VaultKey.load(path: rig.keyPath, create: false) }
    }

    /// systemd's `LoadCredential=` hands a user service its key as the user's own file, mode 0400.
    @Test func aReadOnlyKeyFileLikeASystemdCredentialIsAccepted() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        chmod(rig.keyPath, 0o400)
        let key = try VaultKey.load(path: rig.keyPath, create: false)
        try Vault(path: rig.vaultPath, key: rig.key).save(Self.saved)
        #expect(try Vault(path: rig.directory.file("state/vault"), key: key).load() == Self.saved)
    }

    @Test(.enabled(if: isRoot)) func aKeyFileOfAnotherUserIsRefused() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        chown(rig.keyPath, Self.otherUID, gid_t(Self.otherUID))

        let error = #expect(throws: FileAccessError.self) { try VaultKey.load(path: rig.keyPath, create: false) }
        #expect(error?.description.contains("\(rig.keyPath): it belongs to uid \(Self.otherUID)") == true)
    }

    @Test func aVaultOthersCanReadIsRefusedAndLeftAlone() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        try Vault(path: rig.vaultPath, key: rig.key).save(Self.saved)
        chmod(rig.vaultPath, 0o644)
        let before = FileManager.default.contents(atPath: rig.vaultPath)

        let vault = try Vault(path: rig.vaultPath, key: rig.key)
        let error = #expect(throws: FileAccessError.self) { try vault.load() }
        #expect(error?.description.contains("chmod 600 \(rig.vaultPath)") == true)
        #expect(FileManager.default.contents(atPath: rig.vaultPath) == before)
    }

    @Test(.enabled(if: isRoot)) func aVaultOfAnotherUserIsRefused() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        try Vault(path: rig.vaultPath, key: rig.key).save(Self.saved)
        chown(rig.vaultPath, Self.otherUID, gid_t(Self.otherUID))

        let vault = try Vault(path: rig.vaultPath, key: rig.key)
        let error = #expect(throws: FileAccessError.self) { try vault.load() }
        #expect(error?.description.contains("belongs to uid \(Self.otherUID)") == true)
    }

    // MARK: The vault's directory

    @Test(arguments: [0o777, 0o775, 0o757])
    func aVaultDirectoryOthersCanWriteIsRefusedAndNotChmodded(mode: Int) throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let state = rig.directory.file("state")
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
        chmod(state, mode_t(mode))

        let error = #expect(throws: FileAccessError.self) { try Vault(path: rig.vaultPath, key: rig.key) }
        #expect(error?.description.contains("run: chmod go-w \(state)") == true)
        #expect(Self.mode(of: state) == mode, "a directory brokerd did not create is never chmod'ed")
    }

    @Test(.enabled(if: isRoot)) func aVaultDirectoryOfAnotherUserIsRefused() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let state = rig.directory.file("state")
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
        chown(state, Self.otherUID, gid_t(Self.otherUID))

        let error = #expect(throws: FileAccessError.self) { try Vault(path: rig.vaultPath, key: rig.key) }
        #expect(error?.description.contains("belongs to uid \(Self.otherUID)") == true)
    }

    @Test func aDirectoryAboveTheVaultThatOthersCanWriteIsRefusedUnlessRootOwnedAndSticky() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let shared = rig.directory.file("shared")
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        chmod(shared, 0o777)
        let error = #expect(throws: FileAccessError.self) {
            try Vault(path: shared + "/tokenbroker/vault", key: rig.key)
        }
        #expect(error?.description.contains("\(shared) above it is writable by group or others") == true)
        #expect(!FileManager.default.fileExists(atPath: shared + "/tokenbroker"), "nothing created below it")

        guard Self.isRoot else { return }
        chmod(shared, 0o1777)
        #expect(throws: Never.self) { try Vault(path: shared + "/tokenbroker/vault", key: rig.key) }
        #expect(Self.mode(of: shared + "/tokenbroker") == 0o700)
    }

    /// A link above the directory is followed, as the kernel would; the directory holding the
    /// link is checked too, since whoever can write there can point the link elsewhere.
    @Test func aLinkAboveTheVaultDirectoryIsFollowedAndWhereItLiesIsChecked() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        let real = rig.directory.file("real")
        try FileManager.default.createDirectory(atPath: real, withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: rig.directory.file("link"), withDestinationPath: "real")
        _ = try Vault(path: rig.directory.file("link/tokenbroker/vault"), key: rig.key)
        #expect(Self.mode(of: real + "/tokenbroker") == 0o700, "created through the link")

        let shared = rig.directory.file("shared")
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        chmod(shared, 0o777)
        try FileManager.default.createSymbolicLink(atPath: shared + "/link", withDestinationPath: real)
        let error = #expect(throws: FileAccessError.self) {
            try Vault(path: shared + "/link/tokenbroker/vault", key: rig.key)
        }
        #expect(error?.description.contains("\(shared) above it is writable by group or others") == true)
    }

    @Test func directoriesTheVaultCreatesArePrivate() throws {
        let rig = try Rig()
        defer { rig.directory.remove() }
        _ = try Vault(path: rig.directory.file("a/b/vault"), key: rig.key)
        #expect(Self.mode(of: rig.directory.file("a")) == 0o700)
        #expect(Self.mode(of: rig.directory.file("a/b")) == 0o700)
    }

    /// The permission bits of what is at `path` (a link itself, not its target).
    private static func mode(of path: String) -> Int? {
        var info = stat()
        guard lstat(path, &info) == 0 else { return nil }
        return Int(info.st_mode & 0o7777)
    }

    /// Whether `path` is a regular file itself, not a link.
    private static func isRegularFile(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFREG
    }
}
