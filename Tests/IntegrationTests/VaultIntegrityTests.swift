import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A tampered vault or a wrong key stops brokerd with a clear message and touches nothing.
@Suite struct VaultIntegrityTests {
    /// A broker that has stored one static account, then stopped.
    private func brokerWithVault() async throws -> BrokerProcess {
        let broker = try BrokerProcess()
        try await broker.start()
        let client = try broker.client()
        _ = try await client.add(
            account: "kept", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "kept-token", expiresIn: 3600))
        client.close()
        #expect(broker.stop() == 0)
        return broker
    }

    @Test(arguments: [0, 9, 20, -1, -20])
    func flippedByteIsRefusedAndLeftUntouched(offset: Int) async throws {
        let broker = try await brokerWithVault()
        var bytes = try #require(FileManager.default.contents(atPath: broker.vaultPath))
        let index = offset >= 0 ? offset : bytes.count + offset
        bytes[index] ^= 0x01
        try bytes.write(to: URL(fileURLWithPath: broker.vaultPath))

        #expect(try await broker.runExpectingExit() != 0)
        #expect(FileManager.default.contents(atPath: broker.vaultPath) == bytes)
        #expect(broker.log.contains("left untouched"))
        #expect(!broker.log.contains("kept-token"))
    }

    /// Offsets into a log of two records: its magic, the generation, the snapshot it continues,
    /// the first record's length and nonce, the last record's ciphertext and tag.
    @Test(arguments: [0, 17, 30, 83, 110, -20, -1])
    func flippedByteInTheLogIsRefusedAndLeftUntouched(offset: Int) async throws {
        let broker = try await brokerWithVault()
        try await broker.start()
        let client = try broker.client()
        for token in ["second-token", "third-token"] {
            _ = try await client.setTokens(account: "kept", tokens: TokenSet(accessToken: token, expiresIn: 3600))
        }
        client.close()
        #expect(broker.stop() == 0)
        let snapshot = try #require(FileManager.default.contents(atPath: broker.vaultPath))
        var log = try #require(FileManager.default.contents(atPath: broker.vaultPath + ".log"))
        log[offset >= 0 ? offset : log.count + offset] ^= 0x01
        try log.write(to: URL(fileURLWithPath: broker.vaultPath + ".log"))

        #expect(try await broker.runExpectingExit() != 0)
        #expect(FileManager.default.contents(atPath: broker.vaultPath + ".log") == log)
        #expect(FileManager.default.contents(atPath: broker.vaultPath) == snapshot)
        #expect(broker.log.contains("left untouched"))
        #expect(!broker.log.contains("third-token"))
    }

    @Test func wrongKeyIsRefusedAndVaultLeftUntouched() async throws {
        let broker = try await brokerWithVault()
        let before = try #require(FileManager.default.contents(atPath: broker.vaultPath))
        let otherKey = Data((0..<32).map { _ in UInt8.random(in: 0...255) })
        try otherKey.write(to: URL(fileURLWithPath: broker.keyPath))

        #expect(try await broker.runExpectingExit() != 0)
        #expect(FileManager.default.contents(atPath: broker.vaultPath) == before)
        #expect(broker.log.contains("the key is wrong or the file was modified"))
    }

    /// `Fixtures/format1.vault` was written as every save wrote the vault before its log
    /// (format 1: one file, magic, version 1, nonce, the sealed JSON of a sequence number and
    /// every account), under `Fixtures/format1.key`; it holds one static account `kept`.
    @Test func aFormatOneVaultIsConvertedAtTheFirstStartAndKeepsServing() async throws {
        let broker = try BrokerProcess()
        let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures")
        for directory in [broker.stateDirectory, broker.configDirectory] {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        }
        for (fixture, path) in [("format1.vault", broker.vaultPath), ("format1.key", broker.keyPath)] {
            try FileManager.default.copyItem(atPath: fixtures.appendingPathComponent(fixture).path, toPath: path)
            chmod(path, 0o600)
        }
        try await broker.start()
        let client = try broker.client()
        #expect(try await client.token(account: "kept").accessToken == "format-one-token")
        _ = try await client.setTokens(
            account: "kept", tokens: TokenSet(accessToken: "after-conversion", expiresIn: 3600))
        client.close()
        #expect(broker.stop() == 0)
        #expect(broker.log.contains("converted the vault from format 1"))
        let converted = try #require(FileManager.default.contents(atPath: broker.vaultPath))
        #expect(converted.prefix(10) == Data("TKBVAULT".utf8) + [0, 2])
        #expect(FileManager.default.fileExists(atPath: broker.vaultPath + ".log"), "the change went to the log")

        try await broker.start()
        let again = try broker.client()
        #expect(try await again.token(account: "kept").accessToken == "after-conversion")
        again.close()
        #expect(broker.stop() == 0)
        #expect(broker.log.components(separatedBy: "converted the vault").count == 2, "converted once")
    }

    @Test func secondBrokerOnTheSameVaultRefusesToStart() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let second = try await broker.runExpectingExit()
        #expect(second != 0)
        #expect(broker.log.contains("another brokerd is already using the vault"))
        let client = try broker.client()
        defer { client.close() }
        #expect(try await client.hello().protocol == 1)
    }
}
