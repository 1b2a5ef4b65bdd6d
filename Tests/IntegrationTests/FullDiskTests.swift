import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// protocol/VAULT.md, "Room for the next records": brokerd rotating one-time refresh tokens on
/// a disk filled to the last byte, or whose `fsync` fails, killed and restarted meanwhile,
/// against an IdP that refuses a refresh token used twice. No rotated credential is lost, none
/// is presented twice, `status` names the cause meanwhile, and the account is valid within one
/// retry interval of the disk working again.
@Suite(.serialized, .enabled(if: getuid() == 0, "mounts a tmpfs and preloads a library, as root"))
struct FullDiskTests {
    /// Retries after at most `retryInterval` seconds.
    static let config = "[broker]\nbackoff_base = 1\nbackoff_cap = 2\n"
    static let retryInterval: TimeInterval = 2
    /// What a loaded machine may add to a retry interval before the account shows it.
    static let slack: TimeInterval = 3

    static func provider(_ idp: OAuth2TestIdP) -> ProviderSpec {
        ProviderSpec(
            kind: "oauth2", ["token_endpoint": .string(idp.tokenEndpoint), "client_id": .string(idp.clientID)])
    }

    @Test func twentyRotationsOnAFullDiskAndAKillLoseNoCredential() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-0")
        let broker = try BrokerProcess()
        let disk: SmallTmpfs
        do {
            disk = try SmallTmpfs(at: broker.stateDirectory.path, kibibytes: 2048)
        } catch {
            await idp.shutdown()
            throw error
        }
        do {
            try await rotateOnAFullDisk(broker, disk, idp)
        } catch {
            broker.crash()
            disk.unmount()
            await idp.shutdown()
            throw error
        }
        broker.crash()
        disk.unmount()
        await idp.shutdown()
    }

    private func rotateOnAFullDisk(_ broker: BrokerProcess, _ disk: SmallTmpfs, _ idp: OAuth2TestIdP) async throws {
        try broker.writeConfig(Self.config)
        try await broker.start()
        var owner = try broker.client()
        _ = try await owner.add(account: "disk", provider: Self.provider(idp), tokens: TokenSet(refreshToken: "rt-0"))
        _ = try await owner.refresh(account: "disk")
        // Records of 12 KiB, so that the reserve runs out within the 20 rotations.
        idp.padAccessTokens(by: 12 * 1024)
        try disk.fill()
        #expect(disk.freeBytes == 0)

        var rotated = 0
        var causes: [String] = []
        for _ in 0..<20 {
            let issued = idp.issuedRefreshTokens.count
            _ = try? await owner.refresh(account: "disk")
            if idp.issuedRefreshTokens.count > issued { rotated += 1 }
            if let message = try await owner.status(account: "disk").first?.lastError?.message {
                causes.append(message)
            }
        }
        owner.close()
        let logPath = broker.vaultPath + ".log"
        #expect(rotated >= 5, "the reserve took rotations on the full disk")
        #expect(rotated < 20, "refreshes stopped before the reserve ran out")
        #expect(causes.contains { $0.contains("\(logPath): No space left on device") }, "\(causes)")

        broker.crash()
        try await broker.start()
        owner = try broker.client()
        defer { owner.close() }
        #expect(try await owner.status(account: "disk").first?.state == "valid", "the last rotation saved was kept")
        _ = try? await owner.refresh(account: "disk")
        let afterRestart = try await owner.status(account: "disk").first
        #expect(afterRestart?.state == "stale")
        #expect(afterRestart?.lastError?.message.contains("No space left on device") == true)

        let issued = idp.issuedRefreshTokens.count
        disk.free()
        _ = try await eventually(timeout: Self.retryInterval + Self.slack) {
            try await owner.status(account: "disk").first?.state == "valid" && idp.issuedRefreshTokens.count > issued
        }
        let status = try await owner.status(account: "disk").first
        #expect(status?.state == "valid" && status?.lastError == nil, "valid within one retry interval")
        #expect(idp.issuedRefreshTokens.count > issued, "refreshed once there was room")
        let served = try await owner.token(account: "disk", minTTL: 0)
        #expect(served.accessToken == idp.issuedAccessTokens.last)
        try await expectNoCredentialLost(broker, idp)
    }

    @Test func aRotationWhoseFsyncFailsIsSavedAgainNotRefreshedAgain() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let shim = try FailingFsyncShim(in: directory)
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-0")
        let broker = try BrokerProcess()
        do {
            try await rotateWhileFsyncFails(broker, shim, idp)
        } catch {
            broker.crash()
            await idp.shutdown()
            throw error
        }
        broker.crash()
        await idp.shutdown()
    }

    private func rotateWhileFsyncFails(_ broker: BrokerProcess, _ shim: FailingFsyncShim, _ idp: OAuth2TestIdP)
        async throws
    {
        try broker.writeConfig(Self.config)
        try await broker.start(environment: shim.environment)
        var owner = try broker.client()
        _ = try await owner.add(account: "disk", provider: Self.provider(idp), tokens: TokenSet(refreshToken: "rt-0"))
        _ = try await owner.refresh(account: "disk")
        let saved = try await owner.token(account: "disk", minTTL: 0).accessToken

        try shim.fail(true)
        let calls = idp.refreshCalls.count
        _ = try? await owner.refresh(account: "disk")
        #expect(idp.refreshCalls.count == calls + 1)
        let unsaved = try #require(try await owner.status(account: "disk").first)
        #expect(unsaved.state == "degraded")
        let cause = unsaved.lastError?.message ?? ""
        #expect(cause.contains("\(broker.vaultPath).log: Input/output error"), "\(cause)")
        #expect(try await owner.token(account: "disk", minTTL: 0).accessToken == saved, "nothing unsaved is served")
        for _ in 0..<5 { _ = try? await owner.refresh(account: "disk") }
        // brokerd's own retry of the save, which fails too.
        let failures = shim.failures
        #expect(await eventually(timeout: Self.retryInterval + Self.slack) { shim.failures > failures })
        #expect(idp.refreshCalls.count == calls + 1, "the save is retried, never the refresh")
        owner.close()

        broker.crash()
        try await broker.start(environment: shim.environment)
        owner = try broker.client()
        defer { owner.close() }
        #expect(try await owner.status(account: "disk").first?.state == "valid")
        // One more rotation that cannot be made durable, then the disk works again.
        _ = try? await owner.refresh(account: "disk")
        #expect(try await owner.status(account: "disk").first?.state == "degraded")
        let rotatedCalls = idp.refreshCalls.count
        try shim.fail(false)
        _ = try await eventually(timeout: Self.retryInterval + Self.slack) {
            try await owner.status(account: "disk").first?.state == "valid"
        }
        let status = try await owner.status(account: "disk").first
        #expect(status?.state == "valid" && status?.lastError == nil, "valid within one retry interval")
        #expect(idp.refreshCalls.count == rotatedCalls, "saved, not refreshed again")
        #expect(try await owner.token(account: "disk", minTTL: 0).accessToken == idp.issuedAccessTokens.last)
        try await expectNoCredentialLost(broker, idp)
    }

    /// No refresh token was presented twice, and the vault holds the one the IdP accepts now.
    private func expectNoCredentialLost(_ broker: BrokerProcess, _ idp: OAuth2TestIdP) async throws {
        #expect(idp.rejectedReuse == 0)
        #expect(broker.stop() == 0)
        #expect(try broker.storedRefreshTokens()["disk"] == idp.currentRefreshToken)
    }
}
