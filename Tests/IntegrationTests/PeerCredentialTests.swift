import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// SO_PEERCRED admission: another user is refused with `forbidden` even when the socket's
/// file permissions would let it connect, and the refusal is logged.
@Suite struct PeerCredentialTests {
    @Test(.enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")))
    func anotherUserIsForbidden() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        // Open the file permissions on purpose: only the peer-credential check stands in the way.
        let directory = URL(fileURLWithPath: broker.socketPath).deletingLastPathComponent().path
        for path in [broker.root.path, broker.root.appendingPathComponent("run").path, directory] {
            chmod(path, 0o755)
        }
        chmod(broker.socketPath, 0o666)

        let (status, _, message) = try await ChildProcess.capture(
            "/usr/bin/setpriv",
            [
                "--reuid=65534", "--regid=65534", "--clear-groups", BrokerProcess.binary("brokerctl").path,
                "status", "--socket", broker.socketPath,
            ], environment: broker.environment)
        #expect(status == 7, "\(message)")
        #expect(message.contains("serves only uid 0"))
        #expect(await eventually { broker.log.contains("refused a connection from another user") })
    }
}
