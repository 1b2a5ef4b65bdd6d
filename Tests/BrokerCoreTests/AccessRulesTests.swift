@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing

/// `[accounts.NAME.access]` and the access keys of `[broker]` in `broker.toml`, and the unit a
/// process's cgroup names.
@Suite struct AccessRulesTests {
    @Test func accessTablesAndBrokerKeysAreRead() throws {
        let text = """
            [broker]
            refresh_floor = 90
            admins = ["/usr/bin/brokerctl"]
            socket_group = "tokenusers"
            socket_mode = "0660"

            [accounts.github]
            kind = "static"

            [accounts.github.access]
            executables = ["/usr/bin/git", "/usr/lib/git-core/git-remote-https"]
            units = ["ci-runner.service", "session-2.scope"]
            uids = [1001, 0]

            [accounts.added-at-run-time.access]
            uids = [1002]
            """
        let configuration = try ConfigFile.parse(text, path: "/cfg/broker.toml")
        #expect(configuration.settings.refreshFloor == 90)
        #expect(configuration.accounts.keys.sorted() == ["github"])
        let expected = AccessRules(
            accounts: [
                "github": AccountAccess(
                    executables: ["/usr/bin/git", "/usr/lib/git-core/git-remote-https"],
                    units: ["ci-runner.service", "session-2.scope"], uids: [1001, 0]),
                "added-at-run-time": AccountAccess(uids: [1002]),
            ], admins: ["/usr/bin/brokerctl"], socketGroup: "tokenusers", socketMode: 0o660)
        #expect(configuration.access == expected)
        #expect(configuration.access.listedUIDs == [0, 1001, 1002])
    }

    @Test func noAccessKeysMeanTheOwnerOnly() throws {
        let configuration = try ConfigFile.parse("[accounts.api]\nkind = \"static\"\n", path: "/cfg/broker.toml")
        #expect(configuration.access == AccessRules())
        #expect(configuration.access.socketMode == 0o600)
        #expect(configuration.access.listedUIDs.isEmpty)
    }

    @Test(arguments: [
        ("[accounts.a.access]\nexecutables = [\"git\"]\n", "absolute paths"),
        ("[accounts.a.access]\nexecutables = \"/usr/bin/git\"\n", "absolute paths"),
        ("[accounts.a.access]\nunits = [\"ci-runner\"]\n", "unit names"),
        ("[accounts.a.access]\nunits = [\"user.slice\"]\n", "unit names"),
        ("[accounts.a.access]\nunits = [\"a b.service\"]\n", "unit names"),
        ("[accounts.a.access]\nuids = [-1]\n", "uids"),
        ("[accounts.a.access]\nuids = [4294967295]\n", "uids"),
        ("[accounts.a.access]\nuids = [1.5]\n", "uids"),
        ("[accounts.a.access]\nuids = [\"1001\"]\n", "uids"),
        ("[accounts.a.access]\ngroups = [\"wheel\"]\n", "unknown key groups"),
        ("[accounts.a]\naccess = 3\n", "accounts.a.access must be a table"),
        ("[broker]\nsocket_mode = \"0777\"\n", "octal mode"),
        ("[broker]\nsocket_mode = \"0460\"\n", "octal mode"),
        ("[broker]\nsocket_mode = \"0668\"\n", "octal mode"),
        ("[broker]\nsocket_mode = \"4660\"\n", "octal mode"),
        ("[broker]\nsocket_mode = 660\n", "octal mode"),
        ("[broker]\nsocket_group = \"\"\n", "group name or number"),
        ("[broker]\nsocket_group = \"a:b\"\n", "group name or number"),
        ("[broker]\nadmins = [\"brokerctl\"]\n", "absolute paths"),
    ])
    func badValuesAreRefusedNamingTheKey(text: String, expected: String) {
        #expect {
            try ConfigFile.parse(text, path: "/cfg/broker.toml")
        } throws: { error in
            "\(error)".contains(expected) && "\(error)".contains("/cfg/broker.toml")
        }
    }

    @Test func tooManyEntriesAreRefused() {
        let uids = (0...AccessRules.maximumEntries).map(String.init).joined(separator: ", ")
        #expect(throws: ConfigError.self) {
            try ConfigFile.parse("[accounts.a.access]\nuids = [\(uids)]\n", path: "/cfg/broker.toml")
        }
    }

    @Test func theStoreCountsReplacements() {
        let store = AccessRulesStore()
        let before = store.generation
        store.replace(with: AccessRules(admins: ["/bin/x"]))
        #expect(store.generation != before)
        #expect(store.snapshot().rules.admins == ["/bin/x"])
        #expect(store.snapshot().generation == store.generation)
    }

    @Test(arguments: [
        ("/user.slice/user-1000.slice/user@1000.service/app.slice/ci-runner.service", "ci-runner.service"),
        ("/user.slice/user-1000.slice/user@1000.service/init.scope", "init.scope"),
        ("/user.slice/user-1000.slice/user@1000.service", "user@1000.service"),
        ("/user.slice/user-1000.slice/session-2.scope", "session-2.scope"),
        ("/system.slice/nginx.service", "nginx.service"),
        ("/system.slice/system-getty.slice/getty@tty1.service", "getty@tty1.service"),
        // A delegated unit's own cgroups do not rename it.
        ("/system.slice/runner.service/payload/evil.service", "runner.service"),
        ("/app.slice/allowed-caller.service", "allowed-caller.service"),
        ("/init.scope", "init.scope"),
    ])
    func theUnitOfACgroupPath(path: String, unit: String) {
        #expect(SystemdUnit.unit(ofCgroup: path) == unit)
    }

    @Test(arguments: [
        "/", "", "/user.slice", "/user.slice/user-1000.slice", "/docker/3f2a9c", "/machine.slice/x.mount",
    ])
    func aCgroupOutsideAnyUnit(path: String) {
        #expect(SystemdUnit.unit(ofCgroup: path) == nil)
    }

    @Test func theCgroupFileTakesTheUnifiedLineThenSystemdsOwn() {
        let hybrid = "9:name=systemd:/system.slice/legacy.service\n1:cpu:/\n0::/system.slice/unified.service\n"
        #expect(SystemdUnit.unit(fromCgroupFile: hybrid) == "unified.service")
        let legacy = "4:memory:/x\n1:name=systemd:/user.slice/user-5.slice/session-9.scope\n"
        #expect(SystemdUnit.unit(fromCgroupFile: legacy) == "session-9.scope")
        #expect(SystemdUnit.unit(fromCgroupFile: "4:memory:/system.slice/a.service\n") == nil)
        #expect(SystemdUnit.unit(fromCgroupFile: "") == nil)
    }
}
