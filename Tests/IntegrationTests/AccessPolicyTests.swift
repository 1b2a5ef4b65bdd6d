import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `[accounts.NAME.access]` and `[broker] admins` against a real brokerd: programs told apart by
/// their executable (a copy of perl at another path is another program), on the cached-token
/// fast path and the decoder's full path; a reload applying to connections already open;
/// `status` and `subscribe` showing only what a caller may use; another uid served through a
/// shared socket. The unit rule runs under systemd (`SystemdUserServiceTests`).
@Suite struct AccessPolicyTests {
    /// Sends each line given after the socket path and prints each answer line.
    static let rawClient = """
        use IO::Socket::UNIX;
        my $socket = IO::Socket::UNIX->new(Peer => shift @ARGV) or die "connect: $!";
        for my $line (@ARGV) { print $socket "$line\\n"; my $answer = <$socket>; print $answer; }
        """
    /// Answered on the fast path (flat scanner, cached token).
    static let fastLine = #"{"id":1,"op":"token","account":"api"}"#
    /// Answered on the full path: the scanner leaves nested values to the decoder.
    static let fullLine = #"{"id":2,"op":"token","account":"api","note":{"path":"full"}}"#
    static let perl = "/usr/bin/perl"
    static var perlAvailable: Bool { FileManager.default.isExecutableFile(atPath: perl) }

    /// Answers to the fast and full lines from `program` running the raw client.
    func ask(_ broker: BrokerProcess, as program: String, lines: [String] = [fastLine, fullLine]) throws -> [String] {
        let (status, output, errors) = try ChildProcess.capture(
            program, ["-e", Self.rawClient, broker.socketPath] + lines, environment: broker.environment)
        #expect(status == 0, "\(errors)")
        return output.split(separator: "\n").map(String.init)
    }

    /// A copy of perl at another path inside the broker's directory: another executable.
    func perlCopy(in broker: BrokerProcess) throws -> String {
        let path = broker.root.appendingPathComponent("allowed-perl").path
        try copyExecutable(Self.perl, to: path)
        return path
    }

    /// Copies a program with cp(1): a copy written by this process could be held open for
    /// writing by a child another test forks meanwhile, and fail to run (`ETXTBSY`).
    func copyExecutable(_ source: String, to destination: String) throws {
        let (status, output) = try ChildProcess.run("/bin/cp", [source, destination], environment: [:])
        guard status == 0 else { throw HarnessError("cannot copy \(source): \(output)") }
    }

    @Test(.enabled(if: perlAvailable)) func onlyTheListedExecutableIsServedOnBothPaths() async throws {
        let broker = try BrokerProcess()
        let allowed = try perlCopy(in: broker)
        try broker.writeConfig(
            "[accounts.api]\nkind = \"static\"\n\n[accounts.api.access]\nexecutables = [\"\(allowed)\"]\n")
        try await broker.start()
        defer { broker.stop() }
        let pushed = try await broker.brokerctl(
            ["set-tokens", "api"], stdin: #"{"access_token":"at-api","expires_in":3600}"#)
        #expect(pushed.status == 0, "\(pushed.stderr)")

        let served = try ask(broker, as: allowed)
        #expect(served.count == 2)
        #expect(served.allSatisfy { $0.contains(#""access_token":"at-api""#) }, "\(served)")

        let refused = try ask(broker, as: Self.perl)
        #expect(refused.count == 2)
        #expect(refused.allSatisfy { $0.contains(#""code":"forbidden""#) && !$0.contains("at-api") }, "\(refused)")
        let token = try await broker.brokerctl(["token", "api"])
        #expect(token.status == 7, "\(token.stderr)")
        #expect(token.stdout.isEmpty)

        // One log line names the refused caller (throttled), never the token.
        #expect(await eventually { broker.log.contains("refused a caller") })
        #expect(broker.log.contains("executable \(Self.perl)"))
        #expect(!broker.log.contains("at-api"))
    }

    @Test(.enabled(if: perlAvailable)) func aReloadAppliesToConnectionsAlreadyOpen() async throws {
        let broker = try BrokerProcess()
        let allowed = try perlCopy(in: broker)
        let config = { (executables: String) in
            "[accounts.api]\nkind = \"static\"\n\n[accounts.api.access]\nexecutables = [\(executables)]\n"
        }
        try broker.writeConfig(config("\"\(allowed)\""))
        try await broker.start()
        defer { broker.stop() }
        _ = try await broker.brokerctl(["set-tokens", "api"], stdin: #"{"access_token":"at-api","expires_in":3600}"#)

        // This test's own program is not listed: refused, and `status` does not show the account.
        let client = try broker.client()
        defer { client.close() }
        let refused = await #expect(throws: BrokerError.self) { try await client.token(account: "api") }
        #expect(refused?.code == .forbidden)
        #expect(try await client.status().isEmpty)

        // Listed by a reload: the same connection is served at once.
        let ownExecutable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        try broker.writeConfig(config("\"\(allowed)\", \"\(ownExecutable)\""))
        #expect(try await broker.brokerctl(["reload"]).status == 0)
        #expect(try await client.token(account: "api").accessToken == "at-api")
        #expect(try await client.status().map(\.account) == ["api"])

        // And withdrawn again.
        try broker.writeConfig(config("\"\(allowed)\""))
        broker.signal(SIGHUP)
        #expect(await eventually { (try? await client.token(account: "api")) == nil })
    }

    /// While no rule judges programs, a caller's `/proc` is not read when it connects; a rule a
    /// reload adds then refuses that connection for the guarded account (it cannot be judged),
    /// and serves a new connection from a listed program.
    @Test func aConnectionOpenedBeforeAnyProgramRuleIsRefusedByOneAReloadAdds() async throws {
        let broker = try BrokerProcess()
        try broker.writeConfig("[accounts.api]\nkind = \"static\"\n")
        try await broker.start()
        defer { broker.stop() }
        _ = try await broker.brokerctl(["set-tokens", "api"], stdin: #"{"access_token":"at-api","expires_in":3600}"#)
        let early = try broker.client()
        defer { early.close() }
        #expect(try await early.token(account: "api").accessToken == "at-api")

        let ownExecutable = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        try broker.writeConfig(
            "[accounts.api]\nkind = \"static\"\n\n[accounts.api.access]\nexecutables = [\"\(ownExecutable)\"]\n")
        #expect(try await broker.brokerctl(["reload"]).status == 0)
        let refused = await #expect(throws: BrokerError.self) { try await early.token(account: "api") }
        #expect(refused?.code == .forbidden)
        #expect(broker.log.contains("connected while no rule judged programs"))

        let late = try broker.client()
        defer { late.close() }
        #expect(try await late.token(account: "api").accessToken == "at-api")
    }

    /// Connects, says hello (so the connection was accepted and attested), forks a helper that
    /// keeps the socket, and execs the program given (as `perl -e wait`, which reaps the
    /// helper). The helper sends the `before` line (if any) while its parent still runs the
    /// program that connected, waits until the parent has exec'ed (its command line changes),
    /// sends `after`, and prints both answers.
    static let execAfterConnect = """
        use IO::Socket::UNIX; use IO::Handle;
        my ($path, $program, $before, $after) = @ARGV;
        my $socket = IO::Socket::UNIX->new(Peer => $path) or die "connect: $!";
        $socket->autoflush(1); STDOUT->autoflush(1);
        print $socket qq({"id":0,"op":"hello"}\n); my $hello = <$socket>;
        pipe(my $reader, my $writer) or die "pipe: $!";
        sub command_line { open(my $f, "<", "/proc/$_[0]/cmdline") or return ""; local $/; return <$f>; }
        my $parent = $$; my $started = command_line($parent);
        my $pid = fork() // die "fork: $!";
        if ($pid == 0) {
            close $reader;
            if ($before ne "") { print $socket "$before\n"; print "before " . <$socket>; }
            close $writer;
            for (1..1000) { last if command_line($parent) ne $started; select(undef, undef, undef, 0.01); }
            print $socket "$after\n"; print "after " . <$socket>;
            exit 0;
        }
        close $writer; my $done = <$reader>;
        exec $program, "-e", "wait";
        """

    /// The helper's answers (`before ...`, `after ...`) when `connecting` connects and then execs `then`.
    func execAfterConnect(
        _ broker: BrokerProcess, connecting: String, then program: String, before: String = "", after: String
    ) async throws -> [String] {
        let environment = broker.environment
        let arguments = ["-e", Self.execAfterConnect, broker.socketPath, program, before, after]
        let (status, output, errors) = try await ChildProcess.capture(connecting, arguments, environment: environment)
        #expect(status == 0, "\(errors)")
        return output.split(separator: "\n").map(String.init)
    }

    @Test(.enabled(if: perlAvailable)) func aCallerThatExecsAListedProgramAfterConnectingIsRefused() async throws {
        let broker = try BrokerProcess()
        let allowed = try perlCopy(in: broker)
        let config = { (admins: String) in
            "\(admins)\n[accounts.api]\nkind = \"static\"\n\n[accounts.api.access]\nexecutables = [\"\(allowed)\"]\n"
        }
        try broker.writeConfig(config(""))
        try await broker.start()
        defer { broker.stop() }
        _ = try await broker.brokerctl(["set-tokens", "api"], stdin: #"{"access_token":"at-api","expires_in":3600}"#)
        try broker.writeConfig(config("[broker]\nadmins = [\"\(allowed)\"]\n"))
        #expect(try await broker.brokerctl(["reload"]).status == 0)

        // Unlisted when it connected, listed when it asks: refused on both paths and for an
        // owner operation, since the connection's caller is what connected.
        for line in [Self.fastLine, Self.fullLine, #"{"id":3,"op":"reload"}"#] {
            let answers = try await execAfterConnect(broker, connecting: Self.perl, then: allowed, after: line)
            #expect(answers.count == 1 && answers[0].contains(#""code":"forbidden""#), "\(answers)")
            #expect(!answers.joined().contains("at-api"))
        }
        // Listed when it connected, then another program: served before, refused after.
        let changed = try await execAfterConnect(
            broker, connecting: allowed, then: Self.perl, before: Self.fastLine, after: Self.fastLine)
        #expect(changed.count == 2, "\(changed)")
        #expect(changed.first?.contains(#""access_token":"at-api""#) == true, "\(changed)")
        #expect(changed.last?.contains(#""code":"forbidden""#) == true, "\(changed)")
        let reload = try await execAfterConnect(
            broker, connecting: allowed, then: Self.perl, before: #"{"id":3,"op":"reload"}"#,
            after: #"{"id":4,"op":"reload"}"#)
        #expect(reload.first?.contains(#""ok":true"#) == true, "\(reload)")
        #expect(reload.last?.contains(#""code":"forbidden""#) == true, "\(reload)")
        // Control: a listed program that does not exec passes its connection on with its rights.
        let kept = try await execAfterConnect(
            broker, connecting: allowed, then: allowed, before: Self.fastLine, after: Self.fastLine)
        #expect(kept.count == 2 && kept.allSatisfy { $0.contains(#""access_token":"at-api""#) }, "\(kept)")
        #expect(await eventually { broker.log.contains("no longer runs the program it connected with") })
    }

    @Test(.enabled(if: perlAvailable)) func aListedExecutableTheUserCanReplaceIsWarnedAbout() async throws {
        let broker = try BrokerProcess()
        // A directory anyone may write: whoever runs the tests (root too) could replace the file.
        let open = broker.root.appendingPathComponent("open").path
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: true)
        chmod(open, 0o777)
        let replaceable = open + "/perl"
        try copyExecutable(Self.perl, to: replaceable)
        try broker.writeConfig(
            """
            [accounts.api]
            kind = "static"
            [accounts.api.access]
            executables = ["\(replaceable)", "/usr/bin/perl"]
            """)
        try await broker.start()
        defer { broker.stop() }
        let warnings = broker.log.split(separator: "\n").filter { $0.contains("listed executable is writable") }
        #expect(warnings.count == 1, "\(broker.log)")
        #expect(warnings.first?.contains(replaceable) == true)
        // And again on reload.
        #expect(try await broker.brokerctl(["reload"]).status == 0)
        #expect(
            await eventually {
                broker.log.split(separator: "\n").filter { $0.contains("listed executable is writable") }.count == 2
            })
    }

    /// The git bridge under a rule that lists git: brokerctl run by git is judged by git (the
    /// nearest ancestor that is not a shell), for `git credential fill` and for a clone through
    /// git-remote-http; brokerctl run from a shell or by this test is refused.
    @Test func aRuleListingGitServesTheGitBridgeAndNotAShell() async throws {
        let work = try TemporaryDirectory()
        defer { work.remove() }
        let repositories = try servedRepository(in: work, content: "served\n")
        let issued = SharedValue<OAuth2TestIdP?>(nil)
        let server = try await GitHTTPServer(root: repositories) { password in
            issued.value?.issuedAccessTokens.last == password
        }
        let bridge = try await BridgeBroker.start { _ in
            """
            [accounts.api.access]
            executables = ["/usr/bin/git", "/usr/lib/git-core/git-remote-https"]

            [accounts.api.git]
            hosts = ["127.0.0.1:\(server.port)"]
            """
        }
        issued.value = bridge.idp
        let brokerctl = BrokerProcess.binary("brokerctl").path
        let config = bridge.broker.root.appendingPathComponent("gitconfig").path
        try "[credential]\n\thelper = \"!\(brokerctl) git-credential\"\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        let git = [
            "GIT_CONFIG_GLOBAL": config, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "HOME": work.path,
        ]

        let fill = try await bridge.run(
            ["credential", "fill"], program: "/usr/bin/git", stdin: "protocol=http\nhost=127.0.0.1:\(server.port)\n\n",
            environment: git)
        #expect(fill.status == 0, "\(fill.stderr)")
        #expect(fill.stdout.contains("password=\(bridge.idp.issuedAccessTokens.last ?? "-")"))

        // The server refuses the first token once: git erases it (a refresh) and the next clone is served.
        let url = "http://127.0.0.1:\(server.port)/repo.git"
        _ = try await bridge.run(["clone", "-q", url, work.path + "/one"], program: "/usr/bin/git", environment: git)
        let cloned = try await bridge.run(
            ["clone", "-q", url, work.path + "/two"], program: "/usr/bin/git", environment: git)
        #expect(cloned.status == 0, "\(cloned.stderr)")
        #expect(server.attempts.contains { $0.status == 200 }, "the clone was served with the token")
        #expect(server.attempts.contains { $0.status == 200 && $0.password == bridge.idp.issuedAccessTokens.last })

        let fromShell = try await bridge.run(["-c", "\(brokerctl) token api"], program: "/bin/sh")
        #expect(fromShell.status == 7 && fromShell.stdout.isEmpty, "\(fromShell.stderr)")
        let direct = try await bridge.run(["token", "api"])
        #expect(direct.status == 7 && direct.stdout.isEmpty, "\(direct.stderr)")
        #expect(bridge.broker.log.contains("for pid"), "the refusal names the program brokerctl worked for")
        await server.shutdown()
        await bridge.stop()
        bridge.expectNoSecretInOutputs()
    }

    @Test func subscriptionsCarryOnlyTheAccountsACallerMayUse() async throws {
        let broker = try BrokerProcess()
        try broker.writeConfig("[accounts.hidden.access]\nexecutables = [\"/nonexistent/program\"]\n")
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }

        // Naming an account the caller may not use is refused like `token`.
        let named = await #expect(throws: BrokerError.self) { try await client.events(accounts: ["hidden"]) }
        #expect(named?.code == .forbidden)

        var events = try await client.events().makeAsyncIterator()
        for name in ["hidden", "open"] {
            let added = try await broker.brokerctl(
                ["add", name, "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"t","expires_in":3600}"#)
            #expect(added.status == 0, "\(added.stderr)")
        }
        let first = try await events.next()
        #expect(first?.account == "open")
        #expect(first?.event == .added)
        #expect(try await client.status().map(\.account) == ["open"])
        let status = try await broker.brokerctl(["status", "--json"])
        #expect(!status.stdout.contains("hidden"))
    }

    @Test func adminsNarrowTheOwnerOperationsToListedExecutables() async throws {
        let broker = try BrokerProcess()
        let admin = broker.root.appendingPathComponent("admin-brokerctl").path
        try copyExecutable(BrokerProcess.binary("brokerctl").path, to: admin)
        try broker.writeConfig("[broker]\nadmins = [\"\(admin)\"]\n")
        try await broker.start()
        defer { broker.stop() }

        let tokens = #"{"access_token":"t","expires_in":3600}"#
        let refused = try await broker.brokerctl(["add", "api", "--kind", "static", "--secrets", "-"], stdin: tokens)
        #expect(refused.status == 7, "\(refused.stderr)")
        let (status, _, errors) = try await ChildProcess.capture(
            admin, ["add", "api", "--kind", "static", "--secrets", "-"],
            environment: broker.environment.merging(["TOKENBROKER_SOCKET": broker.socketPath]) { $1 }, stdin: tokens)
        #expect(status == 0, "\(errors)")
        #expect(await eventually { broker.log.contains("operation add") })
    }

    /// uid 1001 through a socket shared with its group (`socket_group`, `socket_mode`): served
    /// the account that lists it, refused every other with the same answer whether it exists
    /// or not, and shown only its account by `status`.
    @Test(.enabled(if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")))
    func anotherUIDIsServedOnlyTheAccountThatListsIt() async throws {
        let broker = try BrokerProcess()
        // The socket's directory must let the group through; brokerd keeps a directory it did
        // not create as long as only its owner may write it.
        let directory = URL(fileURLWithPath: broker.socketPath).deletingLastPathComponent().path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        for path in [broker.root.path, broker.root.appendingPathComponent("run").path] { chmod(path, 0o755) }
        chown(directory, getuid(), 1001)
        chmod(directory, 0o710)
        try broker.writeConfig(
            """
            [broker]
            socket_group = "1001"
            socket_mode = "0660"

            [accounts.shared]
            kind = "static"

            [accounts.shared.access]
            uids = [1001]

            [accounts.private]
            kind = "static"
            """)
        try await broker.start()
        defer { broker.stop() }
        for name in ["shared", "private"] {
            let pushed = try await broker.brokerctl(
                ["set-tokens", name], stdin: #"{"access_token":"at-\#(name)","expires_in":3600}"#)
            #expect(pushed.status == 0, "\(pushed.stderr)")
        }
        var info = stat()
        #expect(lstat(broker.socketPath, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o660)
        #expect(info.st_gid == 1001)

        let asOtherUser = { (arguments: [String]) in
            try ChildProcess.capture(
                "/usr/bin/setpriv",
                ["--reuid=1001", "--regid=1001", "--clear-groups", BrokerProcess.binary("brokerctl").path]
                    + arguments + ["--socket", broker.socketPath], environment: broker.environment)
        }
        let shared = try asOtherUser(["token", "shared"])
        #expect(shared.status == 0, "\(shared.stderr)")
        #expect(shared.stdout == "at-shared\n")
        let hidden = try asOtherUser(["token", "private"])
        let missing = try asOtherUser(["token", "nonexistent"])
        #expect(hidden.status == 7 && missing.status == 7, "\(hidden.stderr) \(missing.stderr)")
        #expect(
            hidden.stderr.replacingOccurrences(of: "private", with: "NAME")
                == missing.stderr.replacingOccurrences(of: "nonexistent", with: "NAME"))
        let status = try asOtherUser(["status", "--json"])
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains("shared") && !status.stdout.contains("private"), "\(status.stdout)")
        let owner = try asOtherUser(["reload"])
        #expect(owner.status == 7)
    }
}
