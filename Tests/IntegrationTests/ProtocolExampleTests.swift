import Foundation
import TestSupport
import Testing

/// Replays every exchange in `protocol/examples/` against a real broker, so the published
/// examples stay true. Format: `{"send": request}` and `{"expect": response}` lines; a group
/// of sends is pipelined, the following expects are matched by id; `"<any>"` matches any value.
@Suite struct ProtocolExampleTests {
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("protocol/examples")

    static var files: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? [])
            .filter { $0.hasSuffix(".jsonl") }.sorted()
    }

    @Test func everyOpHasAnExample() {
        for op in ["hello", "token", "reject", "status", "add", "set_tokens", "remove", "refresh"] {
            #expect(Self.files.contains("\(op).jsonl"), "no example for \(op)")
        }
    }

    @Test(arguments: files)
    func exampleReplays(file: String) async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-example", lifetime: 3600)
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let text = try String(contentsOf: Self.directory.appendingPathComponent(file), encoding: .utf8)
            .replacingOccurrences(of: "${TOKEN_ENDPOINT}", with: idp.tokenEndpoint)
            .replacingOccurrences(of: "${CLIENT_ID}", with: idp.clientID)
            .replacingOccurrences(of: "${CLIENT_SECRET}", with: idp.clientSecret)
            .replacingOccurrences(of: "${REFRESH_TOKEN}", with: "rt-example")
        let lines = try text.split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
        let connection = try RawConnection(path: broker.socketPath)
        var index = 0
        var exchanges = 0
        while index < lines.count {
            while index < lines.count, let request = lines[index]["send"] {
                let data = try JSONSerialization.data(withJSONObject: request)
                connection.send(Array(data) + [0x0A])
                index += 1
            }
            var expected: [[String: Any]] = []
            while index < lines.count, let response = lines[index]["expect"] as? [String: Any] {
                expected.append(response)
                index += 1
            }
            for _ in expected {
                let answer = try #require(connection.readObject(), "\(file): the broker sent no answer")
                let match = expected.first { JSONPattern.matches($0["id"] as Any, answer["id"] as Any) }
                let pattern = try #require(match, "\(file): unexpected answer \(answer)")
                #expect(JSONPattern.matches(pattern, answer), "\(file): \(answer) does not match \(pattern)")
                exchanges += 1
            }
        }
        #expect(exchanges > 0)
        await idp.shutdown()
    }
}

/// Structural JSON comparison where the string `"<any>"` in the pattern matches any value.
enum JSONPattern {
    static func matches(_ pattern: Any, _ value: Any) -> Bool {
        if let text = pattern as? String, text == "<any>" { return true }
        switch (pattern, value) {
        case (let pattern as [String: Any], let value as [String: Any]):
            return Set(pattern.keys) == Set(value.keys) && pattern.allSatisfy { matches($0.value, value[$0.key]!) }
        case (let pattern as [Any], let value as [Any]):
            return pattern.count == value.count && zip(pattern, value).allSatisfy { matches($0, $1) }
        case (let pattern as NSNumber, let value as NSNumber):
            return pattern == value
        case (let pattern as String, let value as String):
            return pattern == value
        case (is NSNull, is NSNull):
            return true
        default:
            return false
        }
    }
}
