@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

/// `broker.toml`: a missing file is an empty broker; a broken one is an error that says where.
@Suite struct ConfigFileTests {
    @Test(arguments: ["", "# only a comment\n", "[broker]\n"])
    func emptyConfigGivesDefaults(text: String) throws {
        #expect(try ConfigFile.parse(text, path: "/cfg/broker.toml").settings == BrokerSettings())
    }

    @Test func defaultsAreTheDocumentedOnes() {
        let settings = BrokerSettings()
        #expect(settings.refreshFraction == 0.25)
        #expect(settings.refreshFloor == 60)
        #expect(settings.defaultMinTTL == 30)
        #expect(settings.connectTimeout > 0 && settings.requestTimeout > 0)
    }

    @Test func validValuesAreRead() throws {
        let text = """
            # tuning
            [broker]
            refresh_fraction = 0.5
            refresh_jitter = 0.1
            refresh_floor = 120
            backoff_base = 2.5
            backoff_cap = 600
            connect_timeout = 3
            request_timeout = 20
            default_lifetime = 900
            default_min_ttl = 45
            line_timeout = 0.5
            idle_connection_timeout = 600
            """
        let settings = try ConfigFile.parse(text, path: "/cfg/broker.toml").settings
        var expected = BrokerSettings()
        expected.refreshFraction = 0.5
        expected.refreshJitter = 0.1
        expected.refreshFloor = 120
        expected.backoffBase = 2.5
        expected.backoffCap = 600
        expected.connectTimeout = 3
        expected.requestTimeout = 20
        expected.defaultLifetime = 900
        expected.defaultMinTTL = 45
        expected.lineTimeout = 0.5
        expected.idleConnectionTimeout = 600
        #expect(settings == expected)
    }

    @Test func brokenTOMLNamesTheFileAndLine() throws {
        let text = "[broker]\nrefresh_fraction = 0.5\nbackoff_cap = = 3\nconnect_timeout = 2\n"
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text, path: "/cfg/broker.toml").settings }
        let message = try #require(error?.description)
        #expect(message.contains("/cfg/broker.toml"))
        #expect(message.contains("line 3"), "\(message)")
    }

    @Test func anUnterminatedStringOnLineFiveIsReportedThere() throws {
        let text = "\n\n[broker]\nrefresh_floor = 30\nrefresh_fraction = \"oops\n"
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text, path: "b.toml").settings }
        #expect(error?.description.contains("line 5") == true, "\(error?.description ?? "")")
    }

    @Test(arguments: [
        ("[broker]\nrefresh_fractoin = 0.3\n", "refresh_fractoin"),
        ("[server]\nport = 1\n", "server"),
        ("log_level = \"debug\"\n", "log_level"),
    ])
    func unknownKeysAreRefused(text: String, key: String) throws {
        let error = #expect(throws: ConfigError.self) { try ConfigFile.parse(text, path: "/cfg/broker.toml").settings }
        #expect(error?.description.contains(key) == true, "\(error?.description ?? "")")
    }

    @Test(arguments: [
        "[broker]\nbackoff_cap = -1\n", "[broker]\nbackoff_cap = \"300\"\n", "[broker]\nbackoff_cap = true\n",
        "[broker]\nbackoff_cap = inf\n", "[broker]\nbackoff_cap = nan\n", "broker = 3\n",
        "[broker]\nline_timeout = 0\n", "[broker]\nline_timeout = 3601\n", "[broker]\nidle_connection_timeout = 0.01\n",
    ])
    func illTypedValuesAreRefused(text: String) {
        #expect(throws: ConfigError.self) { try ConfigFile.parse(text, path: "/cfg/broker.toml").settings }
    }

    @Test func loadReadsAFileAndTreatsAMissingOneAsDefaults() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        #expect(try ConfigFile.load(path: directory.file("missing.toml")).settings == BrokerSettings())
        try Data("[broker]\nrefresh_floor = 90\n".utf8).write(to: URL(fileURLWithPath: directory.file("b.toml")))
        #expect(try ConfigFile.load(path: directory.file("b.toml")).settings.refreshFloor == 90)
    }
}

/// `export_file` and `wlcg_account`: token files the broker keeps fresh.
@Suite struct TokenFileConfigTests {
    @Test func exportFilesAndTheWLCGAccountAreRead() throws {
        let text = """
            [broker]
            wlcg_account = "api"

            [accounts.api]
            kind = "static"
            export_file = "/run/user/1000/api.token"

            [accounts.later]
            export_file = "/home/me/.cache/later.token"
            """
        let configuration = try ConfigFile.parse(text, path: "/cfg/broker.toml")
        #expect(configuration.wlcgAccount == "api")
        #expect(
            configuration.exportFiles == ["api": "/run/user/1000/api.token", "later": "/home/me/.cache/later.token"])
        // A table with only export_file (and access) declares no account, as one with only access.
        #expect(configuration.accounts.keys.sorted() == ["api"])
        #expect(configuration.accounts["api"] == ProviderSpec(kind: "static"))
    }

    @Test(arguments: [
        #"export_file = "relative/api.token""#, #"export_file = "/tmp/dir/""#, #"export_file = "/tmp/..""#,
        "export_file = 5", #"export_file = "/\#(String(repeating: "a", count: 4096))""#,
    ])
    func aBadExportFileIsRefusedNamingIt(line: String) {
        let text = "[accounts.api]\nkind = \"static\"\n\(line)\n"
        #expect {
            try ConfigFile.parse(text, path: "/cfg/broker.toml")
        } throws: { error in
            "\(error)".contains("accounts.api.export_file must be the absolute path of a file")
        }
    }

    /// A token file every process of the user reads would hand out the token around a rule that
    /// names programs.
    @Test(arguments: [
        (
            "[accounts.api]\nexport_file = \"/run/user/1000/api.token\"\n[accounts.api.access]\n"
                + "executables = [\"/usr/bin/git\"]\n",
            "accounts.api.export_file"
        ),
        (
            "[broker]\nwlcg_account = \"api\"\n[accounts.api]\nkind = \"static\"\n[accounts.api.access]\n"
                + "units = [\"ci-runner.service\"]\n",
            "broker.wlcg_account"
        ),
    ])
    func aTokenFileBesideARuleIsRefusedSayingWhy(text: String, key: String) {
        #expect {
            try ConfigFile.parse(text, path: "/cfg/broker.toml")
        } throws: { error in
            "\(error)".contains("/cfg/broker.toml: \(key)") && "\(error)".contains("accounts.api.access")
                && "\(error)".contains("every process of yours can read the token file")
        }
    }

    /// A rule with only `uids` narrows nothing for the owner's processes, and the file is the owner's.
    @Test func aTokenFileBesideARuleOfUIDsOnlyIsRead() throws {
        let text = """
            [broker]
            wlcg_account = "api"

            [accounts.api]
            export_file = "/run/user/1000/api.token"

            [accounts.api.access]
            uids = [1001]
            """
        let configuration = try ConfigFile.parse(text, path: "/cfg/broker.toml")
        #expect(configuration.exportFiles == ["api": "/run/user/1000/api.token"])
        #expect(configuration.access.accounts["api"] == AccountAccess(uids: [1001]))
    }

    @Test(arguments: ["wlcg_account = 5", #"wlcg_account = "no spaces""#, #"wlcg_account = """#])
    func aBadWLCGAccountIsRefusedNamingIt(line: String) {
        #expect {
            try ConfigFile.parse("[broker]\n\(line)\n", path: "/cfg/broker.toml")
        } throws: { error in
            "\(error)".contains("broker.wlcg_account")
        }
    }
}
