import BrokerProtocol
import Foundation
import Testing

/// docs/install.md, "Files": each default path, and the variable that overrides it.
@Suite struct DefaultPathsTests {
    static let base = [
        "HOME": "/home/u", "XDG_RUNTIME_DIR": "/run/user/1000", "XDG_CONFIG_HOME": "/cfg", "XDG_STATE_HOME": "/state",
    ]

    private func paths(_ overrides: [String: String] = [:], removing: [String] = []) -> DefaultPaths {
        var environment = Self.base.merging(overrides) { $1 }
        for name in removing { environment[name] = nil }
        return DefaultPaths(environment: environment)
    }

    @Test func socket() {
        #expect(paths().socket == "/run/user/1000/tokenbroker/broker.sock")
        #expect(paths(["TOKENBROKER_SOCKET": "/tmp/s.sock"]).socket == "/tmp/s.sock")
        #expect(paths(["TOKENBROKER_SOCKET": ""]).socket == "/run/user/1000/tokenbroker/broker.sock")
    }

    /// Without a runtime dir the socket is never under /tmp, where another user
    /// could create the directory first; it goes to logind's /run/user/UID or the user's own
    /// state directory.
    @Test func socketWithoutARuntimeDirectory() {
        let login = "/run/user/\(getuid())"
        let hasLogin = FileManager.default.fileExists(atPath: login)
        let withStateHome = (hasLogin ? login : "/state") + "/tokenbroker/broker.sock"
        let withHomeOnly = (hasLogin ? login : "/home/u/.local/state") + "/tokenbroker/broker.sock"
        #expect(paths(removing: ["XDG_RUNTIME_DIR"]).socket == withStateHome)
        #expect(paths(["XDG_RUNTIME_DIR": ""]).socket == withStateHome)
        #expect(paths(removing: ["XDG_RUNTIME_DIR", "XDG_STATE_HOME"]).socket == withHomeOnly)
        #expect(!paths(removing: ["XDG_RUNTIME_DIR"]).socket.hasPrefix("/tmp/"))
    }

    @Test func config() {
        #expect(paths().config == "/cfg/tokenbroker/broker.toml")
        #expect(paths(["TOKENBROKER_CONFIG": "/etc/b.toml"]).config == "/etc/b.toml")
        #expect(paths(removing: ["XDG_CONFIG_HOME"]).config == "/home/u/.config/tokenbroker/broker.toml")
        #expect(paths(["XDG_CONFIG_HOME": ""]).config == "/home/u/.config/tokenbroker/broker.toml")
    }

    @Test func vault() {
        #expect(paths().vault == "/state/tokenbroker/vault")
        #expect(paths(["TOKENBROKER_VAULT": "/v"]).vault == "/v")
        #expect(paths(removing: ["XDG_STATE_HOME"]).vault == "/home/u/.local/state/tokenbroker/vault")
    }

    @Test func keyFile() {
        let plain = paths().keyFile
        #expect(plain.path == "/cfg/tokenbroker/vault.key" && !plain.fromSystemd)

        let systemd = paths(["CREDENTIALS_DIRECTORY": "/run/credentials/tokenbroker.service"]).keyFile
        #expect(systemd.path == "/run/credentials/tokenbroker.service/vault-key" && systemd.fromSystemd)

        let explicit = paths(["CREDENTIALS_DIRECTORY": "/run/credentials/x", "TOKENBROKER_KEY_FILE": "/k"]).keyFile
        #expect(explicit.path == "/k" && !explicit.fromSystemd)

        let noConfigHome = paths(removing: ["XDG_CONFIG_HOME"]).keyFile
        #expect(noConfigHome.path == "/home/u/.config/tokenbroker/vault.key")
    }
}
