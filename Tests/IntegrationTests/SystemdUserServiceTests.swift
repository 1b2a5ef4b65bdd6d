import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// tokenbroker under a real `systemd --user` manager: unit verification, socket activation,
/// status, reload, watchdog restart of a wedged broker, clean stop, vault key as a credential.
/// On a machine not booted with systemd (CI), the test creates `/run/systemd/system` and the rest
/// of what PID 1 would provide under /run (`UserManager.bootPaths`), and removes it afterwards.
@Suite(.serialized, .enabled(if: UserManager.isAvailable))
struct SystemdUserServiceTests {
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// Also checks that the man pages the units' `Documentation=` lines name exist: the
    /// repository's, then the system's (systemd-analyze runs `man` for each).
    @Test func unitsVerifyWithoutWarnings() throws {
        let manager = try UserManager(start: false)
        defer { manager.shutdown() }
        var environment = manager.environment
        environment["MANPATH"] = Self.repository.appendingPathComponent("man").path + ":"
        let result = try ChildProcess.run(
            "/usr/bin/systemd-analyze",
            ["--user", "verify"]
                + ["tokenbroker.socket", "tokenbroker.service"].map {
                    manager.unitDirectory.appendingPathComponent($0).path
                }, environment: environment)
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty, "\(result.output)")
    }

    @Test func socketActivationStatusReloadWatchdogAndStop() async throws {
        let manager = try UserManager(start: true)
        defer { manager.shutdown() }
        #expect(try manager.systemctl(["start", "tokenbroker.socket"]).status == 0)
        #expect(manager.show("tokenbroker.service", "ActiveState") == "inactive")

        // The first brokerctl call starts the service through the socket.
        let added = try manager.brokerctl(
            ["add", "api", "--kind", "static", "--secrets", "-"],
            stdin: #"{"access_token":"sd-token","expires_in":3600}"#)
        #expect(added.status == 0, "\(added.output)")
        let token = try manager.brokerctl(["token", "api"])
        #expect(token.output == "sd-token\n")
        #expect(manager.show("tokenbroker.service", "ActiveState") == "active")
        #expect(await eventually { manager.show("tokenbroker.service", "StatusText") == "1 account: 1 valid" })

        // The unit's own ExecStart=, state and config directories resolved inside the test's home,
        // and without a credential the broker made its key file there.
        #expect(manager.show("tokenbroker.service", "ExecStart").contains("path=\(manager.brokerd) "))
        let service = manager.serviceEnvironment()
        let stateDirectory = try #require(service["STATE_DIRECTORY"])
        let configurationDirectory = try #require(service["CONFIGURATION_DIRECTORY"])
        #expect(manager.isInside(stateDirectory) && manager.isInside(configurationDirectory))
        #expect(service["CREDENTIALS_DIRECTORY"] == nil)
        #expect(FileManager.default.fileExists(atPath: "\(configurationDirectory)/vault.key"))

        // reload re-reads the config (RELOADING=1 ... READY=1 keeps the unit active).
        try "[accounts.declared]\nkind = \"static\"\n".write(
            toFile: "\(configurationDirectory)/broker.toml", atomically: true, encoding: .utf8)
        #expect(try manager.systemctl(["reload", "tokenbroker.service"]).status == 0)
        // `systemctl reload` can return while the manager still shows the unit reloading.
        #expect(await eventually { manager.show("tokenbroker.service", "ActiveState") == "active" })
        #expect(try manager.brokerctl(["status"]).output.contains("declared"))

        // A wedged broker stops petting the watchdog; systemd kills and restarts it. Wedged
        // here by stopping it whole (SIGSTOP): no switch in brokerd for tests to throw.
        let firstPID = manager.show("tokenbroker.service", "MainPID")
        let stopped = try #require(pid_t(firstPID))
        #expect(stopped > 0 && kill(stopped, SIGSTOP) == 0)
        let restarted = await eventually(timeout: 40) {
            manager.show("tokenbroker.service", "NRestarts") == "1"
                && manager.show("tokenbroker.service", "ActiveState") == "active"
                && manager.show("tokenbroker.service", "MainPID") != firstPID
        }
        #expect(restarted)
        #expect(await eventually { (try? manager.brokerctl(["token", "api"]).output) == "sd-token\n" })

        // stop: STOPPING=1 and a clean exit.
        #expect(try manager.systemctl(["stop", "tokenbroker.service"]).status == 0)
        #expect(manager.show("tokenbroker.service", "Result") == "success")
        #expect(manager.show("tokenbroker.service", "ExecMainStatus") == "0")
    }

    /// With `LoadCredential=vault-key:...` (or `LoadCredentialEncrypted=`, sealed with a host key
    /// kept in the test's directory), the broker encrypts its vault with that key and makes no
    /// key file of its own.
    @Test(arguments: [false, true]) func vaultKeyFromCredential(encrypted: Bool) async throws {
        let manager = try UserManager(start: true)
        defer { manager.shutdown() }
        let key = randomKey()
        let keyPath = manager.root.appendingPathComponent("vault-key").path
        #expect(FileManager.default.createFile(atPath: keyPath, contents: key, attributes: [.posixPermissions: 0o600]))
        var setting = "LoadCredential=vault-key:\(keyPath)"
        if encrypted {
            let sealed = manager.root.appendingPathComponent("vault-key.cred").path
            let result = try manager.run(
                "/usr/bin/systemd-creds", ["encrypt", "--with-key=host", "--name=vault-key", keyPath, sealed])
            #expect(result.status == 0, "\(result.output)")
            setting = "LoadCredentialEncrypted=vault-key:\(sealed)"
        }
        try "[Service]\n\(setting)\n".write(
            to: manager.unitDirectory.appendingPathComponent("tokenbroker.service.d/credential.conf"), atomically: true,
            encoding: .utf8)
        #expect(try manager.systemctl(["daemon-reload"]).status == 0)
        #expect(try manager.systemctl(["start", "tokenbroker.socket"]).status == 0)

        let added = try manager.brokerctl(
            ["add", "api", "--kind", "static", "--secrets", "-"],
            stdin: #"{"access_token":"cred-token","expires_in":3600}"#)
        #expect(added.status == 0, "\(added.output)")
        #expect(try manager.brokerctl(["token", "api"]).output == "cred-token\n")
        let service = manager.serviceEnvironment()
        let credentials = try #require(service["CREDENTIALS_DIRECTORY"])
        #expect(manager.isInside(credentials))
        #expect(FileManager.default.contents(atPath: "\(credentials)/vault-key") == key)
        let vault = try #require(service["STATE_DIRECTORY"]) + "/vault"
        let defaultKey = try #require(service["CONFIGURATION_DIRECTORY"]) + "/vault.key"
        #expect(try manager.systemctl(["stop", "tokenbroker.service"]).status == 0)
        #expect(manager.show("tokenbroker.service", "Result") == "success")
        #expect(!FileManager.default.fileExists(atPath: defaultKey))

        // The vault on disk opens with the credential's key and with no other.
        let broker = try BrokerProcess()
        for directory in [broker.stateDirectory, broker.configDirectory] {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        }
        try FileManager.default.copyItem(atPath: vault, toPath: broker.vaultPath)
        try randomKey().write(to: URL(fileURLWithPath: broker.keyPath))
        chmod(broker.keyPath, 0o600)  // a key file others can read is refused before it is tried
        #expect(try await broker.runExpectingExit() != 0)
        #expect(broker.log.contains("the key is wrong"))
        try key.write(to: URL(fileURLWithPath: broker.keyPath))
        try await broker.start()
        defer { broker.stop() }
        #expect(try await broker.brokerctl(["token", "api"]).stdout == "cred-token\n")
    }

    /// `[accounts.NAME.access] units`: a program run in the listed unit is served, on the fast
    /// path (brokerctl) and the full path (perl sending a line only the decoder reads); the
    /// same programs in another unit, or in none, are refused.
    @Test func aUnitRuleServesOnlyTheListedUnit() async throws {
        let manager = try UserManager(start: true)
        defer { manager.shutdown() }
        let configDirectory = manager.configHome.appendingPathComponent("tokenbroker")
        try FileManager.default.createDirectory(at: configDirectory, withIntermediateDirectories: true)
        try "[accounts.api]\nkind = \"static\"\n\n[accounts.api.access]\nunits = [\"allowed-caller.service\"]\n"
            .write(to: configDirectory.appendingPathComponent("broker.toml"), atomically: true, encoding: .utf8)
        #expect(try manager.systemctl(["start", "tokenbroker.socket"]).status == 0)
        let pushed = try manager.brokerctl(
            ["set-tokens", "api"], stdin: #"{"access_token":"unit-token","expires_in":3600}"#)
        #expect(pushed.status == 0, "\(pushed.output)")

        let socket = manager.runtime.appendingPathComponent("tokenbroker/broker.sock").path
        let brokerctl = BrokerProcess.binary("brokerctl").path
        let perlClient = [
            "/usr/bin/perl", "-MIO::Socket::UNIX", "-e",
            #"my $s = IO::Socket::UNIX->new(Peer => $ARGV[0]) or die; print $s "$ARGV[1]\n"; print scalar <$s>;"#,
            socket, #"{"id":2,"op":"token","account":"api","note":{"path":"full"}}"#,
        ]
        /// Runs `command` as the transient service `unit` and returns its output.
        func inUnit(_ unit: String, _ command: [String]) throws -> (status: Int32, output: String) {
            try manager.run(
                "/usr/bin/systemd-run",
                ["--user", "--unit=\(unit)", "--wait", "--pipe", "--quiet", "--collect"] + command)
        }
        let fast = try inUnit("allowed-caller", [brokerctl, "token", "api", "--socket", socket])
        #expect(fast.output == "unit-token\n")
        let full = try inUnit("allowed-caller", perlClient)
        #expect(full.output.contains(#""access_token":"unit-token""#), "\(full.output)")

        let otherFast = try inUnit("other-caller", [brokerctl, "token", "api", "--socket", socket])
        #expect(otherFast.status != 0)
        #expect(!otherFast.output.contains("unit-token"))
        let otherFull = try inUnit("other-caller", perlClient)
        #expect(otherFull.output.contains(#""code":"forbidden""#), "\(otherFull.output)")
        let outside = try manager.brokerctl(["token", "api"])
        #expect(outside.status == 7, "\(outside.output)")
    }

    /// The shipped unit lets the broker write its token files where docs/bridges.md says they go, with no
    /// drop-in of the user's: an `export_file` in ~/.cache and the WLCG file in the runtime
    /// directory are written and follow a refresh. A token file elsewhere in the home is refused
    /// (ProtectSystem=strict), and the log says which `ReadWritePaths=` to add.
    @Test func tokenFilesAreWrittenUnderTheUnit() async throws {
        let refreshToken = "rt-\(UInt32.random(in: 0...UInt32.max))"
        let idp = try await OAuth2TestIdP(initialRefreshToken: refreshToken)
        let manager = try UserManager(start: false)
        defer { manager.shutdown() }
        let cacheDirectory = manager.cacheHome.appendingPathComponent("tokens")
        let elsewhere = manager.home.appendingPathComponent("tokens")
        for directory in [cacheDirectory, elsewhere, manager.configHome.appendingPathComponent("tokenbroker")] {
            try FileManager.default.createDirectory(
                at: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
        let exportFile = cacheDirectory.appendingPathComponent("api").path
        let wlcgFile = manager.runtime.appendingPathComponent("bt_u\(getuid())").path
        let refusedFile = elsewhere.appendingPathComponent("other").path
        try """
        [broker]
        wlcg_account = "api"

        [accounts.api]
        export_file = "\(exportFile)"

        [accounts.other]
        kind = "static"
        export_file = "\(refusedFile)"

        """.write(
            to: manager.configHome.appendingPathComponent("tokenbroker/broker.toml"), atomically: true,
            encoding: .utf8)
        // Only to read the broker's log here (no journald): its stderr into a file.
        let log = manager.root.appendingPathComponent("brokerd.log").path
        try "[Service]\nStandardError=append:\(log)\n".write(
            to: manager.unitDirectory.appendingPathComponent("tokenbroker.service.d/log.conf"), atomically: true,
            encoding: .utf8)
        try manager.launch()
        #expect(try manager.systemctl(["start", "tokenbroker.socket"]).status == 0)

        let client = try BrokerClient(
            socketPath: manager.runtime.appendingPathComponent("tokenbroker/broker.sock").path)
        _ = try await client.add(account: "api", provider: idp.provider(), tokens: TokenSet(refreshToken: refreshToken))
        let first = try await client.token(account: "api", minTTL: 1).accessToken
        #expect(await eventually { Self.content(exportFile) == first && Self.content(wlcgFile) == first })
        _ = try await client.refresh(account: "api")
        let second = try await client.token(account: "api", minTTL: 1).accessToken
        #expect(second != first)
        #expect(await eventually { Self.content(exportFile) == second && Self.content(wlcgFile) == second })

        let pushed = try manager.brokerctl(
            ["set-tokens", "other"], stdin: #"{"access_token":"other-token","expires_in":3600}"#)
        #expect(pushed.status == 0, "\(pushed.output)")
        #expect(!FileManager.default.fileExists(atPath: refusedFile))
        #expect(
            await eventually {
                Self.content(log)?.contains("ReadWritePaths=\(elsewhere.path) under [Service] in a drop-in") == true
            })
        #expect(Self.content(log)?.contains("other-token") == false)
    }

    private static func content(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    private func randomKey() -> Data { Data((0..<32).map { _ in UInt8.random(in: 0...255) }) }
}

/// A private `systemd --user` manager with tokenbroker's units installed for a temporary home.
/// The manager's `$HOME` and `$XDG_*` point into that home, so `%h`, `%S`, `%E` and `%t` resolve
/// there, never in the user database's home; `shutdown()` checks that nothing appeared outside.
final class UserManager: @unchecked Sendable {
    static let systemdBinary = ["/usr/lib/systemd/systemd", "/lib/systemd/systemd"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }
    static var isAvailable: Bool { getuid() == 0 && systemdBinary != nil }

    /// What a leaking test would create: tokenbroker's directories in the user database's home
    /// and systemd's host credential key.
    static let outsidePaths: [String] = {
        let home = getpwuid(getuid()).map { String(cString: $0.pointee.pw_dir) } ?? "/root"
        return [
            "\(home)/.config/tokenbroker", "\(home)/.local/state/tokenbroker", "/var/lib/systemd/credential.secret",
        ]
    }()

    /// What systemd as PID 1 makes under /run for a root user manager (the boot marker; the empty
    /// directory mounted over /run/credentials for a unit without credentials, else that unit
    /// fails with 226/NAMESPACE) or what the manager adds there. Those missing before the test
    /// are made by it or by the manager, and removed at shutdown.
    static let bootPaths = [
        "/run/systemd/system", "/run/systemd/inaccessible", "/run/systemd/inaccessible/dir", "/run/systemd/unit-root",
        "/run/credentials", "/run/mount",
    ]

    /// Outside /tmp: the unit runs with PrivateTmp=yes and would not see a binary there.
    let root = URL(fileURLWithPath: "/run/tbsd-\(UInt32.random(in: 0...UInt32.max))")
    var home: URL { root.appendingPathComponent("home") }
    var runtime: URL { root.appendingPathComponent("run") }
    var configHome: URL { home.appendingPathComponent(".config") }
    var cacheHome: URL { home.appendingPathComponent(".cache") }
    var unitDirectory: URL { configHome.appendingPathComponent("systemd/user") }
    /// Where the unit's `ExecStart=%h/.local/bin/brokerd` finds the binary under test.
    var brokerd: String { home.appendingPathComponent(".local/bin/brokerd").path }
    private let outsideBefore = UserManager.outsidePaths.map(UserManager.listing)
    private var manager: ChildProcess?
    private var createdBootPaths: [String] = []
    private var mountedRuntime = false

    /// With `installedUnits`, the manager runs the units a package installed in
    /// /usr/lib/systemd/user, as they are; else the repository's, with the brokerd under test
    /// and a shorter watchdog.
    init(start: Bool, installedUnits: Bool = false) throws {
        let fileManager = FileManager.default
        for directory in [
            runtime, unitDirectory.appendingPathComponent("tokenbroker.service.d"),
            home.appendingPathComponent(".local/bin"),
        ] {
            try fileManager.createDirectory(at: directory, withIntermediateDirectories: true)
        }
        chmod(runtime.path, 0o700)
        if installedUnits {
            if start { try launchOrShutDown() }
            return
        }
        for unit in ["tokenbroker.service", "tokenbroker.socket"] {
            try fileManager.copyItem(
                at: SystemdUserServiceTests.repository.appendingPathComponent("systemd/\(unit)"),
                to: unitDirectory.appendingPathComponent(unit))
        }
        try "[Service]\nWatchdogSec=2\n".write(
            to: unitDirectory.appendingPathComponent("tokenbroker.service.d/test.conf"), atomically: true,
            encoding: .utf8)
        try fileManager.copyItem(at: BrokerProcess.binary("brokerd"), to: URL(fileURLWithPath: brokerd))
        if start { try launchOrShutDown() }
    }

    private func launchOrShutDown() throws {
        do {
            try launch()
        } catch {
            shutdown()
            throw error
        }
    }

    /// Starts the manager with this home's environment and waits until it runs.
    func launch() throws {
        // systemd mounts a unit's credentials in a namespace of its own and moves them into
        // $XDG_RUNTIME_DIR/credentials; they show here only through a shared mount, as on a host
        // booted with systemd (a container's mounts are often private).
        guard mount(runtime.path, runtime.path, nil, UInt(MS_BIND), nil) == 0 else {
            throw HarnessError("cannot bind-mount \(runtime.path): \(String(cString: strerror(errno)))")
        }
        mountedRuntime = true
        guard mount(nil, runtime.path, nil, UInt(MS_SHARED), nil) == 0 else {
            throw HarnessError("cannot make \(runtime.path) shared: \(String(cString: strerror(errno)))")
        }
        createdBootPaths = Self.bootPaths.filter { !FileManager.default.fileExists(atPath: $0) }
        for path in ["/run/systemd/system", "/run/systemd/inaccessible", "/run/systemd/inaccessible/dir"]
        where createdBootPaths.contains(path) {
            try FileManager.default.createDirectory(
                atPath: path, withIntermediateDirectories: false,
                attributes: [.posixPermissions: path.hasSuffix("/dir") ? 0 : 0o755])
        }
        manager = try ChildProcess.spawn(Self.systemdBinary!, ["--user"], environment: environment)
        let up = Poll.blocking(timeout: 30, every: .milliseconds(100)) {
            let state = (try? systemctl(["is-system-running"]))?.output ?? ""
            return state.hasPrefix("running") || state.hasPrefix("degraded")
        }
        guard up else { throw HarnessError("systemd --user did not come up") }
    }

    var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = home.path
        environment["XDG_RUNTIME_DIR"] = runtime.path
        environment["XDG_CONFIG_HOME"] = configHome.path
        environment["XDG_CACHE_HOME"] = cacheHome.path
        environment["XDG_STATE_HOME"] = home.appendingPathComponent(".local/state").path
        environment["TOKENBROKER_SOCKET"] = runtime.appendingPathComponent("tokenbroker/broker.sock").path
        // The host key that `systemd-creds` and the manager seal and open credentials with.
        environment["SYSTEMD_CREDENTIAL_SECRET"] = root.appendingPathComponent("credential.secret").path
        for name in [
            "DBUS_SESSION_BUS_ADDRESS", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "TOKENBROKER_CONFIG",
            "TOKENBROKER_VAULT", "TOKENBROKER_KEY_FILE", "CREDENTIALS_DIRECTORY",
        ] {
            environment[name] = nil
        }
        return environment
    }

    /// Stops every unit, ends the manager (waiting for it), removes what the test created, and
    /// expects that nothing changed outside the test's directory.
    func shutdown() {
        if let manager {
            _ = try? systemctl(["stop", "tokenbroker.service", "tokenbroker.socket"])
            _ = try? systemctl(["exit"])
            if !Poll.blocking(timeout: 15, every: .milliseconds(50), { manager.hasExited() }) {
                kill(manager.pid, SIGKILL)
                manager.wait()
            }
        }
        if mountedRuntime { umount2(runtime.path, Int32(MNT_DETACH)) }
        for path in createdBootPaths.reversed() { rmdir(path) }
        try? FileManager.default.removeItem(at: root)
        let left = (createdBootPaths + [root.path]).filter { FileManager.default.fileExists(atPath: $0) }
        #expect(left.isEmpty, "the test left \(left)")
        let changed = zip(Self.outsidePaths, outsideBefore).filter { Self.listing($0.0) != $0.1 }.map(\.0)
        #expect(changed.isEmpty, "the test changed \(changed)")
    }

    /// Whether `path` lies in this manager's temporary directory.
    func isInside(_ path: String) -> Bool { path.hasPrefix(root.path + "/") }

    /// The environment systemd gave the running broker.
    func serviceEnvironment() -> [String: String] {
        let pid = show("tokenbroker.service", "MainPID")
        let environ = (try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/environ"))) ?? Data()
        let entries = environ.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }.compactMap {
            entry -> (String, String)? in
            guard let equals = entry.firstIndex(of: "=") else { return nil }
            return (String(entry[..<equals]), String(entry[entry.index(after: equals)...]))
        }
        return Dictionary(entries) { _, last in last }
    }

    /// Everything below `path` (empty for a file), or nil when nothing is there.
    private static func listing(_ path: String) -> [String]? {
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        return ((try? FileManager.default.subpathsOfDirectory(atPath: path)) ?? []).sorted()
    }

    func systemctl(_ arguments: [String]) throws -> (status: Int32, output: String) {
        try run("/usr/bin/systemctl", ["--user"] + arguments)
    }

    /// One property of a unit, as `systemctl show` prints it.
    func show(_ unit: String, _ property: String) -> String {
        let output = (try? systemctl(["show", "-p", property, "--value", unit]))?.output ?? ""
        return output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func brokerctl(_ arguments: [String], stdin: String? = nil) throws -> (status: Int32, output: String) {
        try run(BrokerProcess.binary("brokerctl").path, arguments, stdin: stdin)
    }

    /// Runs a command with this manager's environment; returns its status and stdout+stderr.
    func run(_ path: String, _ arguments: [String], stdin: String? = nil) throws -> (status: Int32, output: String) {
        try ChildProcess.run(path, arguments, environment: environment, stdin: stdin)
    }
}
