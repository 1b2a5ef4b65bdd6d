@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// How an `exec` command's run is classified (exit code, JSON and the way it ended), and that a
/// denied account runs it no more.
@Suite struct ExecProviderTests {
    static let now = Date(timeIntervalSince1970: 1_795_422_600)

    private func interpret(_ ending: ExecOutput.Ending, _ stdout: String, stderr: String = "") -> Result<
        Grant, RefreshFailure
    > {
        ExecProvider.interpret(
            ExecOutput(ending: ending, stdout: Data(stdout.utf8), stderr: Data(stderr.utf8)), now: Self.now,
            defaultLifetime: 600, timeout: 30)
    }

    @Test func exitZeroWithATokenSetIsSuccess() throws {
        let grant = try interpret(
            .exited(0),
            #"{"access_token":"at-1","expires_in":120,"token_type":"DPoP","refresh_token":"ignored","scope":"s"}"#
        ).get()
        #expect(grant.token.value.text == "at-1")
        #expect(grant.token.type == "DPoP")
        #expect(grant.token.expiresAt == Self.now.addingTimeInterval(120))
        #expect(grant.token.scope == "s")
        #expect(grant.refreshToken == nil, "a refresh_token from the command is ignored")
        #expect(grant.refreshExpiresAt == nil)
    }

    @Test func expiresAtWinsAndTheDefaultLifetimeFillsIn() throws {
        let absolute = try interpret(
            .exited(0), #"{"access_token":"a","expires_at":"2026-11-23T09:00:00Z","expires_in":5}"#
        ).get()
        #expect(absolute.token.expiresAt == ISO8601DateFormatter().date(from: "2026-11-23T09:00:00Z"))
        let fallback = try interpret(.exited(0), #"{"access_token":"a"}"#).get()
        #expect(fallback.token.expiresAt == Self.now.addingTimeInterval(600))
        #expect(fallback.token.type == "Bearer")
    }

    @Test(arguments: [
        (ExecOutput.Ending.exited(2), ""),
        (.exited(2), #"{"access_token":"a"}"#),
        (.exited(0), #"{"error":"denied"}"#),
        (.exited(1), #"{"error":"invalid_grant"}"#),
        (.exited(7), #"{"error":"denied","access_token":"a"}"#),
    ])
    func exitTwoOrADenialErrorIsADenial(ending: ExecOutput.Ending, stdout: String) throws {
        let failure = try #require(interpret(ending, stdout, stderr: "stderr-secret-marker").failure)
        #expect(failure.kind == .denial)
        #expect(!failure.message.contains("stderr-secret-marker"))
    }

    @Test(arguments: [
        (ExecOutput.Ending.exited(1), #"{"access_token":"a"}"#),
        (.exited(3), ""),
        (.exited(0), "not json"),
        (.exited(0), ""),
        (.exited(0), #"{"access_token":""}"#),
        (.exited(0), #"["access_token"]"#),
        (.exited(0), #"{"error":"temporarily_unavailable"}"#),
        (.exited(0), #"{"access_token":"a","expires_at":"next week"}"#),
        (.signalled(9), #"{"access_token":"a"}"#),
        (.timedOut, #"{"access_token":"a"}"#),
        (.outputTooLarge, ""),
        (.launchFailed("/opt/x is missing or not executable"), ""),
    ])
    func everythingElseIsTransient(ending: ExecOutput.Ending, stdout: String) throws {
        let failure = try #require(interpret(ending, stdout, stderr: "stderr-secret-marker").failure)
        #expect(failure.kind == .transient)
        #expect(!failure.message.contains("stderr-secret-marker"))
    }
}

/// The runner really runs commands: no shell, stdin closed, bounded in time and output, and
/// every child waited for.
@Suite struct ExecRunnerTests {
    /// Whether `pid` no longer exists at all (a zombie that nobody waited for still does).
    static func isReaped(_ pid: Int32?) -> Bool {
        guard let pid else { return false }
        return kill(pid, 0) == -1 && errno == ESRCH
    }

    @Test func argumentsArePassedVerbatimWithoutAShell() throws {
        let output = ExecRunner.runBlocking(
            ["/bin/echo", "$HOME", "two words", "; rm -rf /", "*"], timeout: 10)
        #expect(output.ending == .exited(0))
        #expect(String(decoding: output.stdout, as: UTF8.self) == "$HOME two words ; rm -rf / *\n")
        #expect(Self.isReaped(output.pid))
    }

    @Test func stdinIsClosedAndStderrIsKeptApart() throws {
        let output = ExecRunner.runBlocking(
            ["/bin/sh", "-c", "cat; echo done; echo oops >&2; exit 3"], timeout: 10)
        #expect(output.ending == .exited(3))
        #expect(String(decoding: output.stdout, as: UTF8.self) == "done\n")
        #expect(String(decoding: output.stderr, as: UTF8.self) == "oops\n")
    }

    @Test func aCommandThatOverrunsIsKilledAndWaitedFor() throws {
        let output = ExecRunner.runBlocking(["/bin/sleep", "30"], timeout: 0.5)
        #expect(output.ending == .timedOut)
        #expect(Self.isReaped(output.pid))
    }

    @Test func aCommandThatIgnoresSIGTERMIsKilledAnyway() throws {
        let output = ExecRunner.runBlocking(
            ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"], timeout: 0.5)
        #expect(output.ending == .timedOut)
        #expect(Self.isReaped(output.pid))
    }

    @Test func tooMuchOutputStopsTheCommand() throws {
        let output = ExecRunner.runBlocking(["/bin/sh", "-c", "exec cat /dev/zero"], timeout: 20)
        #expect(output.ending == .outputTooLarge)
        #expect(Self.isReaped(output.pid))
    }

    /// A grandchild that keeps stdout open must not hold the result until it exits (or the timeout).
    @Test func aBackgroundGrandchildHoldingStdoutDoesNotBlockTheResult() throws {
        let output = ExecRunner.runBlocking(
            ["/bin/sh", "-c", #"sleep 30 & echo $! >&2; echo '{"access_token":"a"}'"#], timeout: 60)
        let grandchild = Int32(
            String(decoding: output.stderr, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
        defer { if let grandchild { kill(grandchild, SIGKILL) } }
        #expect(output.ending == .exited(0))
        #expect(String(decoding: output.stdout, as: UTF8.self).contains("access_token"))
        #expect(Self.isReaped(output.pid))
        let holder = try #require(grandchild)
        let holderState = Self.state(of: holder)
        #expect(holderState != nil && holderState != "Z", "the result came while the grandchild still held stdout open")
    }

    @Test func aCommandThatClosesItsOutputButKeepsRunningStillTimesOut() throws {
        let output = ExecRunner.runBlocking(["/bin/sh", "-c", "exec >&- 2>&-; sleep 30"], timeout: 0.5)
        #expect(output.ending == .timedOut)
        #expect(Self.isReaped(output.pid))
    }

    @Test func aMissingProgramIsALaunchFailure() throws {
        let output = ExecRunner.runBlocking(["/nonexistent/get-token"], timeout: 5)
        guard case .launchFailed(let reason) = output.ending else {
            Issue.record("expected a launch failure, got \(output.ending)")
            return
        }
        #expect(reason.contains("/nonexistent/get-token"))
    }

    /// A timeout stops the command's own children too (they share its process group).
    @Test func aTimeoutAlsoStopsTheCommandsChildren() throws {
        let output = ExecRunner.runBlocking(["/bin/sh", "-c", "sleep 30 & echo $! >&2; wait"], timeout: 0.5)
        #expect(output.ending == .timedOut)
        let child = try #require(
            Int32(String(decoding: output.stderr, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)))
        let stopped = Poll.blocking(timeout: 2) { kill(child, 0) == -1 || Self.state(of: child) == "Z" }
        #expect(stopped, "the background child outlived the timeout")
    }

    /// The command starts with default signal handling, whatever the broker ignores (SIGPIPE).
    @Test func theCommandGetsDefaultSignalDispositions() throws {
        // Ignoring SIGPIPE is harmless for this test process (NIO programs do it anyway); it is not
        // restored, as another test could be relying on it by then.
        _ = signal(SIGPIPE, SIG_IGN)
        let output = ExecRunner.runBlocking(
            ["/bin/sh", "-c", "grep -E '^Sig(Ign|Blk)' /proc/self/status"], timeout: 10)
        let text = String(decoding: output.stdout, as: UTF8.self)
        let masks = Dictionary(
            uniqueKeysWithValues: text.split(separator: "\n").compactMap { line -> (String, UInt64)? in
                let parts = line.split(separator: "\t")
                return parts.count == 2 ? (String(parts[0]), UInt64(parts[1], radix: 16) ?? .max) : nil
            })
        // Signals 1-31 (glibc itself keeps two of its internal real-time signals ignored).
        let standard: UInt64 = 0x7fff_ffff
        #expect((try #require(masks["SigIgn:"]) & standard) == 0, "\(text)")
        #expect((try #require(masks["SigBlk:"]) & standard) == 0, "\(text)")
    }

    @Test(arguments: [
        (0x0000 as Int32, ExecOutput.Ending.exited(0)), (0x0200, .exited(2)), (0xff00, .exited(255)),
        (0x0009, .signalled(9)), (0x000f, .signalled(15)), (0x0086, .signalled(6)),
    ])
    func waitStatusesDecode(status: Int32, ending: ExecOutput.Ending) {
        #expect(ExecRunner.ending(status) == ending)
    }

    /// The process state letter from /proc (R, S, Z, ...), or nil when it is gone.
    static func state(of pid: Int32) -> String? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return nil }
        return text[text.index(close, offsetBy: 2)...].split(separator: " ").first.map(String.init)
    }

    @Test func theCommandInheritsTheEnvironmentExceptWhatSystemdMeantForTheBroker() {
        let environment = ExecRunner.childEnvironment([
            "HOME": "/home/u", "PATH": "/usr/bin", "NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000",
            "WATCHDOG_PID": "42", "LISTEN_FDS": "1", "LISTEN_PID": "42", "LISTEN_FDNAMES": "broker",
            "CREDENTIALS_DIRECTORY": "/run/credentials/tokenbroker.service", "EMPTY": "",
        ])
        #expect(environment == ["EMPTY=", "HOME=/home/u", "PATH=/usr/bin"])
    }

    /// A denied exec account runs its command no more, whatever the time and whoever asks.
    @Test func aDeniedCommandIsNotRunAgain() async throws {
        try await BrokerHarness.run { harness in
            let runs = harness.directory.file("runs")
            var provider = ProviderSpec(kind: "exec")
            provider["command"] = ["/bin/sh", "-c", .string("echo run >> '\(runs)'; exit 2")]
            _ = try await harness.broker.add(account: "cred", provider: provider, tokens: nil)
            let count = { ((try? String(contentsOfFile: runs, encoding: .utf8)) ?? "").split(separator: "\n").count }
            await #expect(throws: BrokerError.self) { try await harness.broker.token(account: "cred", minTTL: 1) }
            #expect(try await harness.state("cred").state == "needs_login")
            #expect(count() >= 1)
            #expect(await harness.staysQuietAfterDenial("cred", calls: count))
        }
    }

    @Test func theAsyncFormGivesTheSameResult() async throws {
        let output = await ExecRunner.run(["/bin/sh", "-c", "printf x; exit 2"], timeout: 10)
        #expect(output.ending == .exited(2))
        #expect(output.stdout == Data("x".utf8))
    }
}
