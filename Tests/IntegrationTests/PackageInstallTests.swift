import Foundation
import TestSupport
import Testing

/// The installed Debian package under a real `systemd --user` manager: its socket unit, enabled
/// as docs/install.md says, starts its service, /usr/bin/brokerd, which serves
/// /usr/bin/brokerctl. Runs only from scripts/test-package, which installs the package first and
/// sets `TOKENBROKER_INSTALLED_PACKAGE`.
@Suite(
    .serialized,
    .enabled(if: UserManager.isAvailable && ProcessInfo.processInfo.environment["TOKENBROKER_INSTALLED_PACKAGE"] == "1")
)
struct PackageInstallTests {
    @Test func theInstalledSocketStartsTheInstalledBroker() async throws {
        let manager = try UserManager(start: true, installedUnits: true)
        defer { manager.shutdown() }
        let enabled = try manager.systemctl(["enable", "--now", "tokenbroker.socket"])
        #expect(enabled.status == 0, "\(enabled.output)")
        #expect(manager.show("tokenbroker.service", "ActiveState") == "inactive")
        #expect(manager.show("tokenbroker.service", "FragmentPath") == "/usr/lib/systemd/user/tokenbroker.service")

        let added = try manager.run(
            "/usr/bin/brokerctl", ["add", "api", "--kind", "static", "--secrets", "-"],
            stdin: #"{"access_token":"package-token","expires_in":3600}"#)
        #expect(added.status == 0, "\(added.output)")
        let token = try manager.run("/usr/bin/brokerctl", ["token", "api"])
        #expect(token.status == 0 && token.output == "package-token\n", "\(token.output)")
        #expect(manager.show("tokenbroker.service", "ActiveState") == "active")
        #expect(manager.show("tokenbroker.service", "ExecStart").contains("path=/usr/bin/brokerd "))

        // The helpers' names are brokerctl.
        let docker = try manager.run("/usr/bin/docker-credential-tokenbroker", ["version"])
        #expect(docker.status == 0, "\(docker.output)")
        #expect(try manager.systemctl(["disable", "--now", "tokenbroker.socket"]).status == 0)
    }
}
