@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing

/// `[accounts.NAME.git]` and `[accounts.NAME.docker]`: checked and normalised when read.
@Suite struct BridgeSettingsTests {
    @Test func hostsAndRegistriesAreReadNormalised() throws {
        let text = """
            [accounts.api]
            kind = "static"
            [accounts.api.git]
            hosts = ["GitHub.com", "git.example:8443", "[::1]:8080"]
            [accounts.api.docker]
            registries = ["https://index.docker.io/v1/", "GHCR.io", "http://registry.example:5000//"]
            username = "x-access-token"

            [accounts.runtime.git]
            hosts = ["gitlab.example"]
            username = "me"
            """
        let configuration = try ConfigFile.parse(text, path: "/cfg/broker.toml")
        #expect(
            configuration.bridges["api"]
                == AccountBridges(
                    git: GitBridge(hosts: ["github.com", "git.example:8443", "[::1]:8080"], username: "oauth2"),
                    docker: DockerBridge(
                        registries: ["index.docker.io/v1", "ghcr.io", "registry.example:5000"],
                        username: "x-access-token")))
        // A table of bridges only, like one of access only, declares no account.
        #expect(configuration.accounts.keys.sorted() == ["api"])
        #expect(
            configuration.bridges["runtime"]
                == AccountBridges(git: GitBridge(hosts: ["gitlab.example"], username: "me")))
    }

    /// `allow_http`: the listed hosts and registries also served over plain http.
    @Test func allowHTTPNamesListedHostsAndRegistries() throws {
        let text = """
            [accounts.api.git]
            hosts = ["github.com", "Intranet.example:8080"]
            allow_http = ["intranet.example:8080"]
            [accounts.api.docker]
            registries = ["ghcr.io", "registry.example:5000"]
            allow_http = ["http://Registry.example:5000/"]
            [accounts.none.git]
            hosts = ["gitlab.example"]
            allow_http = []
            """
        let bridges = try ConfigFile.parse(text, path: "/cfg/broker.toml").bridges
        #expect(bridges["api"]?.git?.allowHTTP == ["intranet.example:8080"])
        #expect(bridges["api"]?.docker?.allowHTTP == ["registry.example:5000"])
        #expect(bridges["none"]?.git == GitBridge(hosts: ["gitlab.example"]))
        // status carries it as allow_http, and leaves it out when there is none.
        let wire = String(decoding: try Wire.makeEncoder().encode(bridges["api"]?.git), as: UTF8.self)
        #expect(wire.contains(#""allow_http":["intranet.example:8080"]"#))
        let plain = String(decoding: try Wire.makeEncoder().encode(bridges["none"]?.git), as: UTF8.self)
        #expect(!plain.contains("allow_http"))
        #expect(try Wire.makeDecoder().decode(GitBridge.self, from: Data(wire.utf8)) == bridges["api"]?.git)
    }

    @Test(arguments: [
        (
            "[accounts.api.git]\nhosts = [\"github.com\"]\nallow_http = [\"gitlab.example\"]",
            "accounts.api.git.allow_http names gitlab.example, which is not one of its hosts"
        ),
        (
            "[accounts.api.git]\nhosts = [\"github.com\"]\nallow_http = true",
            "accounts.api.git.allow_http must be an array of 0 to 64 hosts"
        ),
        (
            "[accounts.api.docker]\nregistries = [\"ghcr.io\"]\nallow_http = [\"ghcr.io/x\"]",
            "accounts.api.docker.allow_http names ghcr.io/x, which is not one of its registries"
        ),
    ])
    func allowHTTPOfAnUnlistedHostIsRefused(text: String, message: String) {
        #expect {
            try ConfigFile.parse(text, path: "/cfg/broker.toml")
        } throws: { error in
            "\(error)".contains(message)
        }
    }

    @Test func loopbackHostsAreTheCanonicalLiteralsAndLocalhost() {
        for host in ["localhost", "localhost:8080", "127.0.0.1", "127.1.2.3:3000", "[::1]", "[::1]:8080"] {
            #expect(LoopbackHost.contains(hostAndPort: host), "\(host)")
        }
        for host in [
            "localhost.example", "127.0.0.01", "127.0.0.1.example", "128.0.0.1", "[::1]x", "[::2]:80", "0x7f.0.0.1",
            "git.example:8080", "",
        ] {
            #expect(!LoopbackHost.contains(hostAndPort: host), "\(host)")
        }
    }

    @Test(arguments: [
        ("hosts = [\"https://github.com\"]", "accounts.api.git.hosts must be an array of hosts"),
        ("hosts = [\"github.com/org\"]", "accounts.api.git.hosts must be an array of hosts"),
        ("hosts = [\"me@github.com\"]", "accounts.api.git.hosts must be an array of hosts"),
        ("hosts = [\"git hub.com\"]", "accounts.api.git.hosts must be an array of hosts"),
        ("hosts = [\"github.com\\u0007\"]", "accounts.api.git.hosts must be an array of hosts"),
        ("hosts = []", "accounts.api.git.hosts must be an array of 1 to 64"),
        ("hosts = [\"github.com\"]\nusername = \"a b\"", "accounts.api.git.username must be printable ASCII"),
        ("hosts = [\"github.com\"]\npassword = \"x\"", "accounts.api.git: unknown key password"),
    ])
    func badGitTablesAreRefused(body: String, message: String) {
        let text = "[accounts.api]\nkind = \"static\"\n[accounts.api.git]\n" + body
        #expect {
            try ConfigFile.parse(text, path: "/cfg/broker.toml")
        } throws: { error in
            "\(error)".contains(message)
        }
    }

    @Test func tooManyHostsAndOverlongNamesAreRefused() {
        let many = (0...BridgeNames.maximumEntries).map { "\"h\($0).example\"" }.joined(separator: ", ")
        let long = "\"" + String(repeating: "a", count: BridgeNames.maximumLength + 1) + "\""
        for hosts in [many, long] {
            #expect(throws: ConfigError.self) {
                try ConfigFile.parse(
                    "[accounts.api]\nkind = \"static\"\n[accounts.api.git]\nhosts = [\(hosts)]\n", path: "/c")
            }
        }
        #expect(throws: ConfigError.self) {
            try ConfigFile.parse("[accounts.api.docker]\nregistries = [\"ftp://x\"]\n", path: "/c")
        }
    }

    @Test func registriesCompareAsDockerSendsThem() {
        #expect(BridgeNames.registry("https://index.docker.io/v1/") == "index.docker.io/v1")
        #expect(BridgeNames.registry("index.docker.io/v1") == "index.docker.io/v1")
        #expect(BridgeNames.registry("HTTP://Registry.Example:5000/") == "registry.example:5000")
        #expect(BridgeNames.registry("ghcr.io//x") == nil)
        #expect(BridgeNames.registry("") == nil)
        #expect(BridgeNames.registry("https://") == nil)
        #expect(BridgeNames.host("localhost:8080") == "localhost:8080")
        #expect(BridgeNames.host("") == nil)
    }

    /// `docker logout` erases four spellings of a registry in a row: the first has the token
    /// rejected, the ones that follow within 30 s of the refresh leave the new token alone.
    @Test func eraseRejectsATokenOnlyOnceItIsThirtySecondsOld() {
        let refreshed = Date(timeIntervalSince1970: 1_795_422_600)
        #expect(DockerBridge.erasesToken(refreshedAt: nil, now: refreshed), "never refreshed by the broker")
        #expect(!DockerBridge.erasesToken(refreshedAt: refreshed, now: refreshed))
        #expect(!DockerBridge.erasesToken(refreshedAt: refreshed, now: refreshed.addingTimeInterval(29.9)))
        #expect(DockerBridge.erasesToken(refreshedAt: refreshed, now: refreshed.addingTimeInterval(30)))
        #expect(DockerBridge.erasesToken(refreshedAt: refreshed, now: refreshed.addingTimeInterval(3600)))
    }
}
