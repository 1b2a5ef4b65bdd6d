@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Logging
import Testing
import TestSupport

/// A broker in passphrase mode, in process: it starts locked, serves nothing until unlocked,
/// makes a wrong passphrase wait longer each time without holding anyone else up, forgets every
/// token at lock and refreshes at unlock what came due meanwhile.
@Suite struct PassphraseBrokerTests {
    /// A broker on a vault in a temporary directory that holds no key yet, with a test IdP and a
    /// clock the test moves.
    struct Rig {
        let directory: TemporaryDirectory
        let idp: OAuth2TestIdP
        let clock = TestClock()
        let logs = LogRecorder()
        let http: IdPClient
        let broker: Broker
        let keyFile: KeyFile

        init(settings: BrokerSettings = BrokerSettings(), configuration: BrokerConfiguration? = nil) async throws {
            directory = try TemporaryDirectory()
            idp = try await OAuth2TestIdP(initialRefreshToken: "rt-0", serving: .inProcess)
            http = IdPClient.inProcess(settings: settings)
            keyFile = KeyFile(path: directory.file("config/vault.key"), isCredential: false)
            let vault = try Vault(path: directory.file("state/vault"), keyFile: keyFile)
            _ = try vault.prepareKey(configured: .passphrase)
            broker = try Broker(vault: vault, settings: settings, http: http, clock: clock, logger: logs.logger())
            if let configuration { try await broker.configure(configuration) }
        }

        /// Runs `body` against a fresh rig, then shuts it down.
        static func run(
            settings: BrokerSettings = BrokerSettings(), configuration: BrokerConfiguration? = nil,
            _ body: (Rig) async throws -> Void
        ) async throws {
            try await runThenStop(
                try await Rig(settings: settings, configuration: configuration), stop: { await $0.stop() }, body)
        }

        func stop() async {
            await broker.drain()
            await http.shutdown()
            await idp.shutdown()
            directory.remove()
        }

        var provider: ProviderSpec { idp.provider() }

        /// Starts an unlock with `passphrase`, and returns its task once the broker waits out the
        /// delay of a wrong one on the test clock (`sleeps` before it: those waited before).
        func wrongUnlock(_ passphrase: String, sleeps: Int) async -> Task<BrokerError?, Never> {
            let task = Task { () -> BrokerError? in
                do {
                    _ = try await broker.unlock(passphrase: passphrase)
                    return nil
                } catch {
                    return error as? BrokerError
                }
            }
            await clock.sleepersReached(1)
            #expect(clock.asked.count == sleeps + 1)
            return task
        }
    }

    @Test func aLockedBrokerServesNothingAndAWrongPassphraseWaitsLongerEachTime() async throws {
        let declared = BrokerConfiguration(accounts: ["ci": ProviderSpec(kind: "static")])
        try await Rig.run(configuration: declared) { rig in
            let broker = rig.broker
            #expect(broker.padlock.isLocked && broker.padlock.newVault)
            #expect(
                try await broker.status(account: nil) == [
                    AccountStatus(account: "ci", provider: "static", state: "locked")
                ])
            await #expect(throws: BrokerError(.locked, "")) { try await broker.token(account: "ci", minTTL: 0) }
            await #expect(throws: BrokerError(.locked, "")) {
                try await broker.add(account: "api", provider: rig.provider, tokens: nil)
            }
            #expect(await broker.summary() == "locked (run brokerctl unlock)")

            // The first unlock sets the passphrase, and applies the configuration given while locked.
            #expect(
                try await broker.unlock(passphrase: "first passphrase")
                    == LockResult(state: "unlocked", accounts: 1, created: true))
            #expect(try await broker.status(account: "ci").first?.state == "needs_login")
            _ = try await broker.add(
                account: "api", provider: rig.provider,
                tokens: TokenSet(accessToken: "at-pushed", expiresIn: 3600, refreshToken: "rt-0"))
            #expect(try await broker.token(account: "api", minTTL: 0).result.accessToken == "at-pushed")

            #expect(try await broker.lockVault() == LockResult(state: "locked"))
            #expect(broker.padlock.isLocked && !broker.padlock.newVault)
            #expect(broker.cache.token(for: "api", minTTL: 0, now: rig.clock.now()) == nil, "no token stays served")
            #expect(
                try await broker.status(account: nil) == [
                    AccountStatus(account: "api", provider: "oauth2", state: "locked"),
                    AccountStatus(account: "ci", provider: "static", state: "locked"),
                ])
            await #expect(throws: BrokerError(.locked, "")) { try await broker.token(account: "api", minTTL: 0) }
            await #expect(throws: BrokerError(.locked, "")) { try await broker.refreshNow(account: "api") }
            #expect(try await broker.lockVault() == LockResult(state: "locked"), "locking twice is harmless")

            // Wrong passphrases wait 1 s, 2 s, 4 s after their derivation, on the broker's clock.
            // Meanwhile status answers, and a second unlock is turned away instead of deriving
            // 256 MiB more.
            for (attempt, delay) in [(1, 1), (2, 2), (3, 4)] {
                let wrong = await rig.wrongUnlock("wrong \(attempt)", sleeps: attempt - 1)
                #expect(rig.clock.asked.last == .seconds(delay))
                _ = try await broker.status(account: nil)
                await #expect(throws: BrokerError(.busy, "")) {
                    try await broker.unlock(passphrase: "first passphrase")
                }
                rig.clock.advance(by: Double(delay) - 0.5)
                #expect(rig.clock.sleeping == 1, "wrong passphrase \(attempt) answered before its delay")
                rig.clock.advance(by: 0.5)
                #expect(await wrong.value?.code == .forbidden)
                #expect(
                    rig.logs.all.contains {
                        $0.contains("wrong passphrase") && $0.contains("(key: \"delay_s\", value: \(delay))")
                    })
            }
            #expect(broker.padlock.isLocked)

            #expect(
                try await broker.unlock(passphrase: "first passphrase") == LockResult(state: "unlocked", accounts: 2))
            #expect(try await broker.token(account: "api", minTTL: 0).result.accessToken == "at-pushed")
            #expect(rig.idp.callCount == 0)
            #expect(
                try await broker.unlock(passphrase: "anything") == LockResult(state: "unlocked"), "already unlocked")
            // After a right one, a wrong one waits 1 s again.
            _ = try await broker.lockVault()
            let again = await rig.wrongUnlock("wrong again", sleeps: 3)
            #expect(rig.clock.asked.last == .seconds(1))
            rig.clock.advance(by: 1)
            #expect(await again.value?.code == .forbidden)
            #expect(rig.logs.all.filter { $0.contains("(key: \"delay_s\", value: 1)") }.count == 2)
            // Checked outside #expect, whose failure message would print the passphrase.
            let logged = rig.logs.all.contains { $0.contains("first passphrase") || $0.contains("wrong 1") }
            #expect(!logged, "a passphrase in the log")
        }
    }

    @Test func wrongPassphrasesWaitOneSecondDoublingUpToThirty() {
        let delays = (1...8).map { Padlock.delay(afterFailures: $0) }
        #expect(delays == [1, 2, 4, 8, 16, 30, 30, 30].map { Duration.seconds($0) })
    }

    @Test func aRefreshThatCameDueWhileLockedRunsAtUnlock() async throws {
        var settings = BrokerSettings()
        settings.overdueSpread = 0
        try await Rig.run(settings: settings) { rig in
            let broker = rig.broker
            _ = try await broker.unlock(passphrase: "pw")
            _ = try await broker.add(
                account: "api", provider: rig.provider,
                tokens: TokenSet(accessToken: "at-pushed", expiresIn: 600, refreshToken: "rt-0"))
            _ = try await broker.lockVault()

            rig.clock.advance(by: 3600)
            #expect(await broker.runDueRefreshes() == nil, "nothing is scheduled while locked")
            #expect(rig.idp.callCount == 0)

            _ = try await broker.unlock(passphrase: "pw")
            _ = await broker.runDueRefreshes()
            await broker.drain()
            #expect(rig.idp.callCount == 1, "the refresh that came due ran at the first pass after unlock")
            #expect(rig.idp.calls.first?.refreshToken == "rt-0")
            let token = try await broker.token(account: "api", minTTL: 60)
            #expect(token.result.accessToken == rig.idp.issuedAccessTokens.last)
            #expect(rig.idp.callCount == 1)
        }
    }

    @Test func rekeyMovesARunningBrokerFromTheKeyFileToAPassphraseAndBack() async throws {
        let directory = try TemporaryDirectory()
        let http = IdPClient.inProcess(settings: BrokerSettings())
        defer {
            Task { await http.shutdown() }
            directory.remove()
        }
        let keyFile = KeyFile(path: directory.file("config/vault.key"), isCredential: false)
        let vault = try Vault(path: directory.file("state/vault"), keyFile: keyFile)
        #expect(try vault.prepareKey(configured: .keyFile) == .keyFile)
        let broker = try Broker(vault: vault, settings: BrokerSettings(), http: http, logger: LogRecorder().logger())
        _ = try await broker.add(
            account: "s", provider: ProviderSpec(kind: "static"), tokens: TokenSet(accessToken: "at-s", expiresIn: 3600)
        )
        await #expect(throws: BrokerError(.badRequest, "")) { try await broker.lockVault() }
        await #expect(throws: BrokerError(.badRequest, "")) { try await broker.rekey(to: "keyfile", passphrase: nil) }
        await #expect(throws: BrokerError(.badRequest, "")) {
            try await broker.rekey(to: "passphrase", passphrase: nil)
        }
        await #expect(throws: BrokerError(.badRequest, "")) { try await broker.rekey(to: "other", passphrase: "pw") }

        #expect(try await broker.rekey(to: "passphrase", passphrase: "pw") == RekeyResult(key: "passphrase"))
        #expect(!FileManager.default.fileExists(atPath: keyFile.path), "the key file is removed last")
        #expect(try vault.sealing() == .passphrase)
        #expect(try await broker.token(account: "s", minTTL: 0).result.accessToken == "at-s", "still unlocked")
        _ = try await broker.lockVault()
        await #expect(throws: BrokerError(.locked, "")) { try await broker.rekey(to: "keyfile", passphrase: nil) }
        await #expect(throws: BrokerError(.forbidden, "")) { try await broker.unlock(passphrase: "not pw") }
        #expect(try await broker.unlock(passphrase: "pw").accounts == 1)

        #expect(try await broker.rekey(to: "keyfile", passphrase: nil) == RekeyResult(key: "keyfile"))
        #expect(FileManager.default.fileExists(atPath: keyFile.path), "the key file is written first")
        #expect(try vault.sealing() == .keyFile)
        #expect(try await broker.token(account: "s", minTTL: 0).result.accessToken == "at-s")
    }
}
