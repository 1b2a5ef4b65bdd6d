import BrokerProtocol
import Foundation
import Logging
import Synchronization

@testable import BrokerCore

/// A fresh directory under the system temp dir, removed by `remove()`.
struct TemporaryDirectory: Sendable {
    let path: String

    init() throws {
        path =
            FileManager.default.temporaryDirectory.appendingPathComponent("tokenbroker-test-\(UUID().uuidString)")
            .path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    func file(_ name: String) -> String { path + "/" + name }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

/// Wall-clock time that only moves when a test says so.
final class TestClock: WallClock {
    private let current: Mutex<Date>

    init(_ start: Date = Date(timeIntervalSince1970: 1_795_422_600)) { current = Mutex(start) }

    func now() -> Date { current.withLock { $0 } }

    func advance(by seconds: TimeInterval) { current.withLock { $0 = $0.addingTimeInterval(seconds) } }
}

/// Keeps every log line (message and metadata rendered as text) for assertions.
final class LogRecorder: Sendable {
    private let lines = Mutex<[String]>([])

    var all: [String] { lines.withLock { $0 } }

    func record(_ line: String) { lines.withLock { $0.append(line) } }

    func logger() -> Logger {
        Logger(label: "test") { label in RecordingLogHandler(recorder: self) }
    }
}

struct RecordingLogHandler: LogHandler {
    let recorder: LogRecorder
    var logLevel: Logger.Level = .trace
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { $1 }
        recorder.record("\(event.level) \(event.message) \(merged.sorted { $0.key < $1.key })")
    }
}

extension AccountRecord {
    /// A record with every field set, for vault round trips.
    static func sample(_ name: String, refreshToken: String = "rt-\(UUID().uuidString)") -> AccountRecord {
        let obtained = Date(timeIntervalSince1970: 1_795_000_000)
        return AccountRecord(
            name: name,
            provider: ProviderConfig(
                OAuth2Settings(
                    tokenEndpoint: URL(string: "https://idp.example/oauth/token")!, clientID: "client-\(name)",
                    clientAuth: .clientSecretBasic, scope: "read write")),
            secrets: AccountSecrets(
                refreshToken: refreshToken, refreshExpiresAt: obtained.addingTimeInterval(86_400),
                clientSecret: "cs-\(UUID().uuidString)"),
            token: AccessToken(
                value: "at-\(UUID().uuidString)", type: "Bearer", expiresAt: obtained.addingTimeInterval(3600),
                obtainedAt: obtained, idToken: "id.token.\(name)", scope: "read"),
            needsLogin: false,
            lastError: AccountError(code: "unavailable", message: "HTTP 503", at: obtained.addingTimeInterval(-60)),
            lastRefreshAt: obtained)
    }
}

extension Data {
    /// Whether the bytes of `text` occur anywhere in this data.
    func contains(_ text: String) -> Bool { range(of: Data(text.utf8)) != nil }
}
