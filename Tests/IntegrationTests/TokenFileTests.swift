import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Token files kept fresh by the broker (`export_file`, `wlcg_account`), on the real
/// brokerd with a rotating IdP whose tokens live seconds.
@Suite struct TokenFileTests {
    /// A broker whose config keeps `api`'s token in `export/api.token` and in the WLCG file.
    private static func broker(exportDirectoryMode: mode_t = 0o700, wlcg: Bool = true) throws -> (
        BrokerProcess, exportFile: String, wlcgFile: String
    ) {
        let broker = try BrokerProcess()
        let directory = broker.root.appendingPathComponent("export").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        chmod(directory, exportDirectoryMode)
        let exportFile = directory + "/api.token"
        try broker.writeConfig(
            (wlcg ? "[broker]\nwlcg_account = \"api\"\n\n" : "") + "[accounts.api]\nexport_file = \"\(exportFile)\"\n")
        return (broker, exportFile, broker.root.appendingPathComponent("run/bt_u\(getuid())").path)
    }

    private static func content(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    private static func mode(_ path: String) -> mode_t? {
        var info = stat()
        return lstat(path, &info) == 0 ? info.st_mode & 0o7777 : nil
    }

    /// `broker()` started, with `api` an `oauth2` account of a new IdP that rotates refresh
    /// tokens, starting from `refreshToken`.
    private static func brokerWithOAuth2Account() async throws -> (
        BrokerProcess, idp: OAuth2TestIdP, client: BrokerClient, exportFile: String, wlcgFile: String,
        refreshToken: String
    ) {
        let refreshToken = "rt-\(UInt32.random(in: 0...UInt32.max))"
        let idp = try await OAuth2TestIdP(initialRefreshToken: refreshToken, lifetime: 3600)
        let (broker, exportFile, wlcgFile) = try Self.broker()
        try await broker.start()
        let client = try broker.client()
        _ = try await client.add(account: "api", provider: idp.provider(), tokens: TokenSet(refreshToken: refreshToken))
        return (broker, idp, client, exportFile, wlcgFile, refreshToken)
    }

    @Test func theFilesHoldTheServedTokenThroughRefreshesAndSetTokensAndGoAtLogout() async throws {
        let (broker, idp, client, exportFile, wlcgFile, refreshToken) = try await Self.brokerWithOAuth2Account()

        let served = try await client.token(account: "api", minTTL: 1).accessToken
        #expect(Self.content(exportFile) == served)
        #expect(Self.content(wlcgFile) == served)
        #expect(Self.mode(exportFile) == 0o600)
        #expect(Self.mode(wlcgFile) == 0o600)

        // Tokens of 4 seconds: for two lifetimes and more, with no client asking, the files
        // follow each refresh and hold one of the two newest tokens (the one before stays valid
        // until well after the next is out).
        idp.setLifetime(4)
        _ = try await client.refresh(account: "api")
        let firstCount = idp.issuedAccessTokens.count
        // The file is sampled at every look until the broker has refreshed twice on its own.
        var samples = 0
        let refreshed = await eventually(timeout: 30) {
            let issued = idp.issuedAccessTokens
            let file = Self.content(exportFile)
            #expect(file.map { issued.suffix(2).contains($0) } == true, "sample \(samples)")
            samples += 1
            return issued.count >= firstCount + 2
        }
        #expect(refreshed, "the broker refreshed on its own")
        idp.setLifetime(3600)
        _ = try await client.refresh(account: "api")
        #expect(
            try await eventually {
                let current = try await client.token(account: "api", minTTL: 0).accessToken
                return Self.content(exportFile) == current && Self.content(wlcgFile) == current
            })

        _ = try await client.setTokens(account: "api", tokens: TokenSet(accessToken: "at-pushed", expiresIn: 3600))
        #expect(Self.content(exportFile) == "at-pushed")
        #expect(Self.content(wlcgFile) == "at-pushed")

        _ = try await client.logout(account: "api", force: true)
        #expect(!FileManager.default.fileExists(atPath: exportFile))
        #expect(!FileManager.default.fileExists(atPath: wlcgFile))
        // Nothing but the token is in the files; no staging file is left beside them.
        let left = try FileManager.default.contentsOfDirectory(
            atPath: broker.root.appendingPathComponent("export").path)
        #expect(left.isEmpty, "\(left)")
        client.close()
        #expect(broker.stop() == 0)
        await idp.shutdown()
        // Checked outside #expect, whose failure message would print the secret and the log.
        let log = broker.log
        let logged = ([refreshToken, idp.clientSecret] + idp.issuedRefreshTokens + idp.issuedAccessTokens).contains {
            log.contains($0)
        }
        #expect(!logged, "a secret in the broker's log")
    }

    @Test func aStaticAccountsFileIsWrittenAtStartAndRemovedWithTheAccount() async throws {
        let (broker, exportFile, wlcgFile) = try Self.broker()
        try await broker.start()
        let client = try broker.client()
        _ = try await client.add(
            account: "api", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "at-1", expiresIn: 3600))
        #expect(Self.content(exportFile) == "at-1")
        client.close()

        // A restart writes the file again from the vault (here: after it was deleted by hand).
        #expect(broker.stop() == 0)
        unlink(exportFile)
        try await broker.start()
        #expect(Self.content(exportFile) == "at-1")
        #expect(Self.content(wlcgFile) == "at-1")

        let again = try broker.client()
        _ = try await again.remove(account: "api")
        #expect(!FileManager.default.fileExists(atPath: exportFile))
        #expect(!FileManager.default.fileExists(atPath: wlcgFile))
        again.close()
        #expect(broker.stop() == 0)
    }

    @Test func aSymbolicLinkAtThePathIsNeitherFollowedNorReplaced() async throws {
        let (broker, exportFile, _) = try Self.broker(wlcg: false)
        let target = broker.root.appendingPathComponent("home/target").path
        try "untouched".write(toFile: target, atomically: false, encoding: .utf8)
        #expect(symlink(target, exportFile) == 0)
        try await broker.start()
        let client = try broker.client()
        _ = try await client.add(
            account: "api", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "at-symlink-test-token", expiresIn: 3600))

        #expect(Self.content(target) == "untouched")
        var info = stat()
        #expect(lstat(exportFile, &info) == 0 && info.st_mode & S_IFMT == S_IFLNK)
        #expect(broker.log.contains("token file not written"), "\(broker.log)")
        #expect(!broker.log.contains("at-symlink-test-token"))
        // The account is not disturbed.
        #expect(try await client.token(account: "api").accessToken == "at-symlink-test-token")
        #expect(try await client.status(account: "api").first?.state == "valid")
        client.close()
        #expect(broker.stop() == 0)
    }

    @Test(arguments: [0o770 as mode_t, 0o707])
    func aDirectoryOthersCanWriteIsRefused(mode: mode_t) async throws {
        let (broker, exportFile, _) = try Self.broker(exportDirectoryMode: mode, wlcg: false)
        try await broker.start()
        let client = try broker.client()
        _ = try await client.add(
            account: "api", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "at-1", expiresIn: 3600))
        #expect(!FileManager.default.fileExists(atPath: exportFile))
        #expect(broker.log.contains("writable by no one else"), "\(broker.log)")
        #expect(try await client.token(account: "api").accessToken == "at-1")
        client.close()
        #expect(broker.stop() == 0)
    }

    @Test func aReloadMovesTheFileAndADeniedRefreshRemovesIt() async throws {
        let (broker, idp, client, exportFile, wlcgFile, _) = try await Self.brokerWithOAuth2Account()
        let served = try await client.token(account: "api").accessToken
        #expect(await eventually { Self.content(exportFile) == served })

        // Another path, and no WLCG account: the old files go, the new one holds the token.
        let moved = broker.root.appendingPathComponent("export/moved.token").path
        try broker.writeConfig("[accounts.api]\nexport_file = \"\(moved)\"\n")
        _ = try await client.reload()
        #expect(Self.content(moved) == served)
        #expect(!FileManager.default.fileExists(atPath: exportFile))
        #expect(!FileManager.default.fileExists(atPath: wlcgFile))

        // A refresh the IdP denies leaves no token to serve, so none in the file.
        idp.setBehavior(.oauthError(400, error: "invalid_grant", description: nil))
        await #expect(throws: BrokerError.self) { _ = try await client.refresh(account: "api") }
        #expect(try await client.status(account: "api").first?.state == "needs_login")
        #expect(!FileManager.default.fileExists(atPath: moved))
        client.close()
        #expect(broker.stop() == 0)
        await idp.shutdown()
    }

    @Test func lockingRemovesTheFilesAndUnlockingWritesThemAgain() async throws {
        let (broker, exportFile, _) = try Self.broker(wlcg: false)
        try await broker.start(arguments: ["--passphrase"])
        let client = try broker.client()
        _ = try await client.perform(.unlock(passphrase: "correct horse"))
        _ = try await client.add(
            account: "api", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "at-locked-test", expiresIn: 3600))
        #expect(Self.content(exportFile) == "at-locked-test")

        _ = try await client.perform(.lock())
        #expect(!FileManager.default.fileExists(atPath: exportFile))
        _ = try await client.perform(.unlock(passphrase: "correct horse"))
        #expect(Self.content(exportFile) == "at-locked-test")
        client.close()
        #expect(broker.stop() == 0)
    }
}
