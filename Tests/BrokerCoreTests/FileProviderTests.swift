@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A token file in a fresh directory, and a `file` provider reading it.
private struct TokenFileRig {
    let directory: TemporaryDirectory
    let path: String
    let provider: FileProvider

    init(name: String = "token.json") throws {
        directory = try TemporaryDirectory()
        path = directory.file(name)
        provider = FileProvider(settings: FileSettings(path: path), defaultLifetime: 600)
    }

    /// Writes `text` to the token file (mode 0600 unless told), dated `modified` when given.
    func write(_ text: String, mode: mode_t = 0o600, modified: Date? = nil) throws {
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        chmod(path, mode)
        if let modified { try FileManager.default.setAttributes([.modificationDate: modified], ofItemAtPath: path) }
    }

    /// A token file body: `access_token` plus whatever else is given, as JSON.
    static func body(_ token: String, _ extra: String = #","expires_in":3600"#) -> String {
        #"{"access_token":"\#(token)"\#(extra)}"#
    }

    func refresh(now: Date = Date()) async -> Result<Grant, RefreshFailure> {
        await provider.refresh(AccountRecord.sample("file"), now: now)
    }
}

/// `file` accounts: the settings a `provider` object gives them, and the provider reading real
/// files in a temp dir.
@Suite struct FileProviderTests {
    // MARK: reading

    @Test func theTokenIsServedWithLifetimesCountedFromTheFilesModification() async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        let written = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 - 600).rounded())
        try rig.write(TokenFileRig.body("at-file-1", #","expires_in":3600,"token_type":"DPoP""#), modified: written)
        let grant = try await rig.refresh().get()
        #expect(grant.token.value.text == "at-file-1")
        #expect(grant.token.type == "DPoP")
        #expect(grant.token.obtainedAt == written)
        #expect(grant.token.expiresAt == written.addingTimeInterval(3600), "expires_in counts from the file's mtime")
        #expect(grant.refreshToken == nil && grant.refreshURL == nil)

        try rig.write(TokenFileRig.body("at-file-2", #","expires_at":"2999-01-01T00:00:00Z""#))
        let dated = try await rig.refresh().get()
        #expect(dated.token.value.text == "at-file-2")
        #expect(dated.token.expiresAt == Wire.parseRFC3339("2999-01-01T00:00:00Z"))
    }

    @Test func aRewrittenFileIsNoticedAndReadAgain() async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        try rig.write(TokenFileRig.body("at-old"))
        #expect(rig.provider.sourceChanged(), "a file never read counts as changed")
        #expect(try await rig.refresh().get().token.value.text == "at-old")
        #expect(!rig.provider.sourceChanged(), "nothing changed since the read")

        try rig.write(TokenFileRig.body("at-newer"))
        #expect(rig.provider.sourceChanged())
        #expect(try await rig.refresh().get().token.value.text == "at-newer")
        #expect(!rig.provider.sourceChanged())

        // A new mode, a replacement by rename, a removal: each is a change worth a read.
        chmod(rig.path, 0o640)
        #expect(rig.provider.sourceChanged())
        _ = await rig.refresh()
        let staging = rig.directory.file("staging.json")
        try Data(TokenFileRig.body("at-renamed").utf8).write(to: URL(fileURLWithPath: staging))
        chmod(staging, 0o600)
        #expect(rename(staging, rig.path) == 0)
        #expect(rig.provider.sourceChanged())
        #expect(try await rig.refresh().get().token.value.text == "at-renamed")
        unlink(rig.path)
        #expect(rig.provider.sourceChanged())
        _ = await rig.refresh()
        #expect(!rig.provider.sourceChanged(), "a file still missing is no news")
    }

    @Test(arguments: [0o620 as mode_t, 0o602, 0o666])
    func aFileOthersCanWriteIsRefused(mode: mode_t) async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        try rig.write(TokenFileRig.body("at-writable-secret"), mode: mode)
        let failure = try #require(await rig.refresh().failure)
        #expect(failure.kind == .transient)
        #expect(failure.message.contains(rig.path), "\(failure.message)")
        #expect(failure.message.contains("chmod go-w"), "\(failure.message)")
        #expect(!failure.message.contains("at-writable-secret"))
    }

    @Test func aFileInADirectoryOthersCanWriteIsRefused() async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        try rig.write(TokenFileRig.body("at-dir-secret"))
        chmod(rig.directory.path, 0o775)
        let failure = try #require(await rig.refresh().failure)
        #expect(failure.kind == .transient)
        #expect(failure.message.contains(rig.directory.path), "\(failure.message)")
        #expect(failure.message.contains("writable by group or others"), "\(failure.message)")
        #expect(!failure.message.contains("at-dir-secret"))
    }

    /// Only root can give a file away to test this.
    @Test(.enabled(if: getuid() == 0)) func aFileOfAnotherUserIsRefused() async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        try rig.write(TokenFileRig.body("at-foreign"))
        #expect(chown(rig.path, 4242, 4242) == 0)
        let failure = try #require(await rig.refresh().failure)
        #expect(failure.message.contains("uid 4242"), "\(failure.message)")
    }

    @Test func aSymbolicLinkIsNotFollowedEvenToAGoodFile() async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        let target = rig.directory.file("real.json")
        try Data(TokenFileRig.body("at-behind-link").utf8).write(to: URL(fileURLWithPath: target))
        chmod(target, 0o600)
        #expect(symlink(target, rig.path) == 0)
        let failure = try #require(await rig.refresh().failure)
        #expect(failure.message.contains("symbolic link"), "\(failure.message)")
        #expect(failure.message.contains(rig.path))
        #expect(!failure.message.contains("at-behind-link"))

        // Pointed at a file others may write, it is refused all the more.
        chmod(target, 0o666)
        #expect(try #require(await rig.refresh().failure).message.contains("symbolic link"))
    }

    @Test func aFileOverTheLimitIsRefusedUnread() async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        let padding = String(repeating: " ", count: FileProvider.sizeLimit)
        try rig.write(TokenFileRig.body("at-huge", #","expires_in":3600"# + padding))
        let failure = try #require(await rig.refresh().failure)
        #expect(failure.message.contains("\(FileProvider.sizeLimit) bytes"), "\(failure.message)")
        #expect(!failure.message.contains("at-huge"))
    }

    @Test(arguments: [
        ("", "JSON object"), ("{\"access_token\": \"at-cut", "JSON object"), ("[\"at-array\"]", "JSON object"),
        ("{\"expires_in\": 3600}", "access_token"), ("{\"access_token\": \"\"}", "access_token"),
        ("{\"access_token\": \"at-x\", \"expires_in\": \"soon\"}", "expires_in"),
        ("{\"access_token\": \"at-x\", \"expires_at\": \"tomorrow\"}", "expires_at"),
        ("{\"access_token\": \"at with space\", \"expires_in\": 60}", "access_token"),
    ])
    func unusableContentIsRefused(text: String, mentions: String) async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        try rig.write(text)
        let failure = try #require(await rig.refresh().failure)
        #expect(failure.kind == .transient)
        #expect(failure.message.contains(mentions), "\(failure.message)")
        #expect(failure.message.contains(rig.path), "\(failure.message)")
    }

    @Test func anExpiredTokenIsAFailureNotAGrant() async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        try rig.write(
            TokenFileRig.body("at-stale-secret", #","expires_in":60"#), modified: Date().addingTimeInterval(-120))
        let failure = try #require(await rig.refresh().failure)
        #expect(failure.kind == .transient)
        #expect(failure.message.contains("expired"), "\(failure.message)")
        #expect(failure.message.contains(rig.path))
        #expect(!failure.message.contains("at-stale-secret"))
    }

    @Test func aMissingFileOrAFIFOIsRefusedWithoutWaiting() async throws {
        let rig = try TokenFileRig()
        defer { rig.directory.remove() }
        let missing = try #require(await rig.refresh().failure)
        #expect(missing.message.contains(rig.path) && missing.message.contains("No such file"), "\(missing.message)")
        #expect(mkfifo(rig.path, 0o600) == 0)
        let fifo = try #require(await rig.refresh().failure)
        #expect(fifo.message.contains("not a regular file"), "\(fifo.message)")
    }
}

/// `file` accounts in the engine, on a clock the test moves: the file is polled and re-read
/// when it changes, nothing is saved when it did not, a broken file is reported while the last
/// good token is served, and an expired one is not served.
@Suite struct FileAccountTests {
    @Test func theEnginePollsTheFileAndServesWhatItHolds() async throws {
        try await BrokerHarness.run { h in
            let directory = h.directory.file("tokens")
            #expect(mkdir(directory, 0o700) == 0)
            let path = directory + "/api.json"
            /// Rewrites the file in place, dated by the test's clock.
            func write(_ token: String) throws {
                try Data(#"{"access_token":"\#(token)","expires_in":3600}"#.utf8).write(to: URL(fileURLWithPath: path))
                chmod(path, 0o600)
                try FileManager.default.setAttributes([.modificationDate: h.clock.now()], ofItemAtPath: path)
            }
            /// One pass of the scheduler, `seconds` later, and the refreshes it started.
            func poll(after seconds: TimeInterval = 2) async {
                h.clock.advance(by: seconds)
                _ = await h.broker.runDueRefreshes()
                await h.broker.drain()
            }

            try write("at-file-1")
            let added = try await h.broker.add(
                account: "cron", provider: ProviderSpec(kind: "file", ["path": .string(path)]), tokens: nil)
            #expect(added.state == "refreshing", "the file is read at once")
            #expect(try await h.broker.token(account: "cron", minTTL: 60).result.accessToken == "at-file-1")
            #expect(try await h.state("cron").state == "valid")
            #expect(try await h.state("cron").provider == "file")

            // Unchanged: polls read nothing and save nothing.
            let saved = try Self.identity(of: h.vaultPath)
            for _ in 0..<3 { await poll() }
            // A reload builds the provider afresh, which reads the file again: the same token.
            try await h.broker.configure(BrokerConfiguration())
            await poll()
            #expect(try Self.identity(of: h.vaultPath) == saved, "the vault was written though nothing changed")

            // Rewritten: the next poll serves the new token and saves it.
            try write("at-file-2-longer")
            await poll()
            #expect(
                h.broker.cache.token(for: "cron", minTTL: 60, now: h.clock.now())?.result.accessToken
                    == "at-file-2-longer")
            #expect(try h.vaultCopy()?.accounts.first { $0.name == "cron" }?.token?.value.text == "at-file-2-longer")

            // Writable by others: refused and reported; the last good token is still served.
            chmod(path, 0o666)
            await poll()
            let stale = try await h.state("cron")
            #expect(stale.state == "stale")
            #expect(stale.lastError?.message.contains(path) == true, "\(stale.lastError?.message ?? "")")
            #expect(try await h.broker.token(account: "cron", minTTL: 60).result.accessToken == "at-file-2-longer")

            // Fixed, though the token is the same: the error is cleared.
            chmod(path, 0o600)
            await poll()
            #expect(try await h.state("cron").state == "valid")
            #expect(try await h.state("cron").lastError == nil)

            // Expired and never rewritten: not served, and the message says why.
            let expiresAt = try #require(try await h.state("cron").expiresAt)
            await poll(after: expiresAt.timeIntervalSince(h.clock.now()) + 1)
            let expired = await #expect(throws: BrokerError.self) {
                try await h.broker.token(account: "cron", minTTL: 0)
            }
            #expect(expired?.code == .unavailable)
            #expect(expired?.message.contains("expired") == true, "\(expired?.message ?? "")")
            #expect(try await h.state("cron").state == "unavailable")

            // Rewritten at last: served again on the next poll.
            try write("at-file-3")
            await poll()
            #expect(try await h.broker.token(account: "cron", minTTL: 60).result.accessToken == "at-file-3")
            #expect(h.idp.callCount == 0)
        }
    }

    /// A `token` request no cached token answers reads the file again, so a rewrite is served
    /// before the next poll.
    @Test func aRequestTheCachedTokenCannotAnswerReadsTheFileAgain() async throws {
        try await BrokerHarness.run { h in
            let path = h.directory.file("short.json")
            func write(_ token: String, lifetime: Int) throws {
                try Data(#"{"access_token":"\#(token)","expires_in":\#(lifetime)}"#.utf8)
                    .write(to: URL(fileURLWithPath: path))
                chmod(path, 0o600)
                try FileManager.default.setAttributes([.modificationDate: h.clock.now()], ofItemAtPath: path)
            }
            try write("at-short", lifetime: 60)
            _ = try await h.broker.add(
                account: "cron", provider: ProviderSpec(kind: "file", ["path": .string(path)]), tokens: nil)
            #expect(try await h.broker.token(account: "cron", minTTL: 30).result.accessToken == "at-short")
            let tooShort = await #expect(throws: BrokerError.self) {
                try await h.broker.token(account: "cron", minTTL: 600)
            }
            #expect(tooShort?.code == .unavailable)
            #expect(tooShort?.message.contains("min_ttl") == true)
            try write("at-long", lifetime: 3600)
            #expect(try await h.broker.token(account: "cron", minTTL: 600).result.accessToken == "at-long")
        }
    }

    /// The vault file's inode and modification time: a save replaces the file.
    private static func identity(of path: String) throws -> [Int] {
        var info = stat()
        try #require(stat(path, &info) == 0)
        return [Int(info.st_ino), info.st_mtim.tv_sec, info.st_mtim.tv_nsec]
    }
}
