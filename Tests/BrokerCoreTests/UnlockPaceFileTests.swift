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

/// The pace of unlock attempts kept beside the vault: written whole and private, read back
/// within bounds, and refused when it is not what brokerd wrote.
@Suite struct UnlockPaceFileTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    @Test func aPaceIsSavedPrivatelyAndReadBackWithinBounds() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = UnlockPaceFile(vaultPath: directory.file("vault"))
        #expect(file.path == directory.file("vault.unlock-pace"))
        #expect(try file.read(now: now, longest: 30) == nil, "no file: no pace")

        try file.save(UnlockPaceFile.Pace(failures: 3, until: now.addingTimeInterval(4)))
        var info = stat()
        #expect(lstat(file.path, &info) == 0 && info.st_mode & 0o777 == 0o600)
        #expect(try String(contentsOfFile: file.path, encoding: .utf8) == "failures=3\nuntil=1800000004\n")
        #expect(
            try file.read(now: now, longest: 30) == UnlockPaceFile.Pace(failures: 3, until: now.addingTimeInterval(4)))
        #expect(!FileManager.default.fileExists(atPath: file.path + ".next"))

        // A clock set back, or a count beyond any delay, is cut to bounds.
        try Data("failures=999999\nuntil=1900000000\n".utf8).write(to: URL(fileURLWithPath: file.path))
        #expect(
            try file.read(now: now, longest: 30)
                == UnlockPaceFile.Pace(failures: UnlockPaceFile.maximumFailures, until: now.addingTimeInterval(30)))

        // A right passphrase: the file goes.
        try file.save(UnlockPaceFile.Pace(failures: 0, until: now))
        #expect(!FileManager.default.fileExists(atPath: file.path))
        try file.save(UnlockPaceFile.Pace(failures: 0, until: now))
    }

    @Test(arguments: [
        "", "failures=1\n", "failures=1\nuntil=x\n", "failures=-1\nuntil=5\n", "until=5\nfailures=1\n",
        "failures=1\nuntil=5\nmore=1\n", "failures=1\nuntil=5", "failures=1\nuntil=1234567890123\n",
        String(repeating: "failures=1\nuntil=5\n", count: 4),
    ])
    func aFileBrokerdDidNotWriteIsRefused(content: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = UnlockPaceFile(vaultPath: directory.file("vault"))
        let fd = open(file.path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        #expect(fd >= 0 && write(fd, content, content.utf8.count) == content.utf8.count)
        close(fd)
        #expect(throws: FileAccessError.self) { try file.read(now: now, longest: 30) }
    }

    @Test func aLinkOrAFileOthersCanReadIsRefused() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = UnlockPaceFile(vaultPath: directory.file("vault"))
        try Data("failures=1\nuntil=5\n".utf8).write(to: URL(fileURLWithPath: directory.file("elsewhere")))
        chmod(directory.file("elsewhere"), 0o600)
        #expect(symlink(directory.file("elsewhere"), file.path) == 0)
        #expect(throws: FileAccessError.self) { try file.read(now: now, longest: 30) }
        // Saving replaces the link itself; the file it pointed at is untouched.
        try file.save(UnlockPaceFile.Pace(failures: 2, until: now))
        #expect(try String(contentsOfFile: directory.file("elsewhere"), encoding: .utf8) == "failures=1\nuntil=5\n")
        #expect(try file.read(now: now, longest: 30)?.failures == 2)
        chmod(file.path, 0o644)
        #expect(throws: FileAccessError.self) { try file.read(now: now, longest: 30) }
    }

    @Test func aRestoredPaceMakesTheFirstUnlockWaitAndTheNextDelayLonger() {
        let padlock = Padlock()
        padlock.restore(UnlockPaceFile.Pace(failures: 3, until: now.addingTimeInterval(2.5)))
        #expect(padlock.takeRestoredWait(now: now) == .milliseconds(2500))
        #expect(padlock.takeRestoredWait(now: now) == .zero, "waited once")
        #expect(padlock.failed() == .seconds(8), "the fourth wrong passphrase in a row")
        padlock.restore(UnlockPaceFile.Pace(failures: 1, until: now.addingTimeInterval(-1)))
        #expect(padlock.takeRestoredWait(now: now) == .zero, "a delay already over")
        padlock.succeeded()
        #expect(padlock.failures == 0 && padlock.failed() == .seconds(1))
    }
}
