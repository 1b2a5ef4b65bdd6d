import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `brokerctl exec`: a command that outlives several tokens reads a valid one from
/// `BEARER_TOKEN_FILE` every time; the file is gone afterwards; exit codes and signals pass through.
@Suite struct ExecCommandTests {
    /// Tokens live this many seconds at the test IdP: the broker refreshes 4 s before expiry
    /// (half the lifetime), which a loaded machine running the whole suite still makes in time
    /// (the test IdP answers from the test process, whose threads the other suites share).
    static let lifetime = 8

    @Test func aLongJobReadsAValidTokenFromTheFileAtEveryMoment() async throws {
        let bridge = try await BridgeBroker.start(lifetime: Self.lifetime) { _ in "" }
        let log = bridge.broker.root.appendingPathComponent("reads.log").path
        // Runs for more than two lifetimes, reading the file every 0.1 s; then exits 7.
        let script = """
            echo "file $BEARER_TOKEN_FILE $(stat -c %a "$BEARER_TOKEN_FILE") $BEARER_TOKEN" > "$1"
            echo "fds $(ls /proc/$$/fd | tr '\\n' ' ')" >> "$1"
            end=$(($(date +%s) + \(3 * Self.lifetime)))
            while [ "$(date +%s)" -lt "$end" ]; do
                echo "read $(date +%s.%N) $(cat "$BEARER_TOKEN_FILE")" >> "$1"
                sleep 0.1
            done
            exit 7
            """
        let result = try await bridge.run(["exec", "api", "--min-ttl", "1", "--", "sh", "-c", script, "job", log])
        #expect(result.status == 7, "\(result.stderr)")

        let lines = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").map {
            $0.split(separator: " ").map(String.init)
        }
        let file = try #require(lines.first)
        #expect(file.count == 4)
        // In a directory of its own under $XDG_RUNTIME_DIR, not in the socket's (run/tokenbroker).
        #expect(file[1].hasPrefix(bridge.broker.root.appendingPathComponent("run/tokenbroker-exec-").path))
        #expect(!file[1].hasPrefix(bridge.broker.root.appendingPathComponent("run/tokenbroker").path + "/"))
        #expect(file[2] == "600")
        // A token the IdP issued (on a loaded machine the job may start after a refresh or two).
        #expect(bridge.idp.issuedAccessTokens.contains(file[3]))
        #expect(!FileManager.default.fileExists(atPath: file[1]), "the file is removed when the command ends")
        // Only standard input, output and error (and the directory ls reads) reach the command.
        #expect(
            lines.dropFirst().first.map { Array($0.dropFirst()) }?.allSatisfy { ["0", "1", "2", "3"].contains($0) }
                == true)

        let reads = lines.filter { $0.first == "read" }
        #expect(reads.count > 20)
        for read in reads {
            let at = Date(timeIntervalSince1970: Double(read[1]) ?? 0)
            #expect(read.count == 3 && bridge.wasValid(read[2], at: at, lifetime: Double(Self.lifetime)), "\(read)")
        }
        #expect(Set(reads.map { $0.last ?? "" }).count >= 3, "the job outlived at least two tokens")
        await bridge.stop()
        bridge.expectNoSecretInOutputs()
    }

    /// A job reading the file every 0.1 s for three lifetimes never reads a token the IdP has
    /// revoked, though the IdP revokes the old access token at each rotation and the broker
    /// refreshes on its own schedule (at half the lifetime, before brokerctl's timer, at a third):
    /// the file follows the broker's `refreshed` events. Only the events' delivery is allowed.
    @Test func theFileFollowsTheBrokerWhenTheIdPRevokesTheOldTokenAtEachRotation() async throws {
        let lifetime = 6
        let bridge = try await BridgeBroker.start(lifetime: lifetime) { _ in "" }
        bridge.idp.revokeOnRotation()
        let log = bridge.broker.root.appendingPathComponent("reads.log").path
        let script = """
            end=$(($(date +%s) + \(3 * lifetime)))
            while [ "$(date +%s)" -lt "$end" ]; do
                echo "read $(date +%s.%N) $(cat "$BEARER_TOKEN_FILE")" >> "$1"
                sleep 0.1
            done
            """
        let result = try await bridge.run(["exec", "api", "--min-ttl", "1", "--", "sh", "-c", script, "job", log])
        #expect(result.status == 0, "\(result.stderr)")
        let reads = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").map {
            $0.split(separator: " ").map(String.init)
        }
        #expect(reads.count > 100)
        let refused = reads.filter { read in
            read.count != 3
                || !bridge.idp.accepted(read[2], at: Date(timeIntervalSince1970: Double(read[1]) ?? 0), grace: 0.3)
        }
        #expect(refused.isEmpty, "\(refused.count) reads of a token the IdP refused, first \(refused.first ?? [])")
        #expect(Set(reads.map { $0.last ?? "" }).count >= 4, "the broker rotated at least three times")
        await bridge.stop()
        bridge.expectNoSecretInOutputs()
    }

    /// While the IdP is down, brokerctl cannot renew the file for seconds, trying every half
    /// second; it says so once, and once when renewing works again.
    @Test func anOutageIsToldOnceAndItsEndOnce() async throws {
        let bridge = try await BridgeBroker.start(lifetime: 3) { _ in "[broker]\nbackoff_cap = 0.5\n" }
        // The job has started, with its first token, before the IdP goes down, and runs until
        // the test lets it go (a minute at most), so a late wake-up of this test cannot cut it short.
        let started = bridge.broker.root.appendingPathComponent("started").path
        let release = bridge.broker.root.appendingPathComponent("release").path
        // The job writes where its token file is (the file exists before the job starts).
        let job =
            "echo \"$BEARER_TOKEN_FILE\" > '\(started)'; i=0; "
            + "while [ ! -e '\(release)' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"
        async let run = bridge.run(["exec", "api", "--min-ttl", "1", "--", "sh", "-c", job])
        let read = { (path: String) in (try? String(contentsOfFile: path, encoding: .utf8)) ?? "" }
        #expect(await eventually(timeout: 30) { read(started).hasSuffix("\n") })
        let tokenFile = read(started).trimmingCharacters(in: .newlines)
        let issuedAt = try #require(bridge.idp.refreshCalls.last?.at)
        bridge.idp.setBehavior(.status(503, retryAfter: nil))
        // The token (3 s) runs out during the outage; brokerctl retries every 0.5 s from then:
        // two of its tries after the end of the token, failed.
        #expect(
            await eventually(timeout: 30) {
                bridge.idp.calls.filter { $0.at > issuedAt.addingTimeInterval(3) }.count >= 2
            })
        bridge.idp.setBehavior(.normal)
        // brokerctl's next try renews the file; then the job may end.
        #expect(
            await eventually(timeout: 30) {
                let renewed = bridge.lastIssued
                return renewed != nil && read(tokenFile) == renewed
            })
        // Waits on brokerctl to tell the outage's end, which it does after the file is renewed.
        try await Task.sleep(for: .seconds(1))
        #expect(FileManager.default.createFile(atPath: release, contents: nil))
        let result = try await run
        #expect(result.status == 0)
        let lines = result.stderr.split(separator: "\n")
        #expect(lines.filter { $0.contains("cannot renew the token of api") }.count == 1, "\(result.stderr)")
        #expect(lines.filter { $0.contains("renewed the token of api again") }.count == 1, "\(result.stderr)")
        await bridge.stop()
        bridge.expectNoSecretInOutputs()
    }

    @Test func signalsPassToTheCommandAndTheFileIsRemoved() async throws {
        let bridge = try await BridgeBroker.start { _ in "" }
        let log = bridge.broker.root.appendingPathComponent("signal.log").path
        let output = open(
            bridge.broker.root.appendingPathComponent("exec.out").path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        defer { close(output) }
        let exec = try ChildProcess.spawn(
            BrokerProcess.binary("brokerctl").path,
            [
                "exec", "api", "--env", "API_TOKEN", "--", "sh", "-c",
                #"echo "$BEARER_TOKEN_FILE $API_TOKEN" > "$1"; exec sleep 60"#, "job", log,
            ],
            environment: bridge.environment(), output: output)
        #expect(await eventually { ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").hasSuffix("\n") })
        let fields = try String(contentsOfFile: log, encoding: .utf8).split(separator: " ").map {
            $0.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #expect(fields.count == 2 && fields.last == bridge.lastIssued)
        #expect(FileManager.default.fileExists(atPath: fields[0]))
        kill(exec.pid, SIGTERM)
        #expect(exec.wait() == 128 + SIGTERM)
        #expect(!FileManager.default.fileExists(atPath: fields[0]))

        // A command that is not there: 127, as a shell answers, and no file left behind.
        let missing = try await bridge.run([
            "exec", "api", "--", "no-such-command-\(UInt32.random(in: 0...UInt32.max))",
        ])
        #expect(missing.status == 127 && missing.stderr.contains("cannot run"))
        let directory = bridge.broker.root.appendingPathComponent("run").path
        #expect(
            try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasPrefix("tokenbroker-exec-") }
                == [])
        // Never in the socket's directory nor under it (docs/bridges.md says to bind-mount it into
        // containers), even when the runtime directory is that directory: then under /tmp.
        let socketDirectory = bridge.broker.root.appendingPathComponent("run/tokenbroker").path
        for runtime in [socketDirectory, ""] {
            let shown = try await bridge.run(
                [
                    "exec", "api", "--", "sh", "-c",
                    #"echo "$BEARER_TOKEN_FILE $(stat -c '%a %U' "${BEARER_TOKEN_FILE%/*}")""#,
                ],
                environment: ["XDG_RUNTIME_DIR": runtime])
            #expect(shown.status == 0, "\(shown.stderr)")
            let parts = shown.stdout.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
            let path = try #require(parts.first)
            #expect(!path.hasPrefix(socketDirectory + "/") && path.contains("/tokenbroker-exec-"), "\(path)")
            #expect(Array(parts.dropFirst()) == ["700", String(cString: getpwuid(getuid()).pointee.pw_name)])
            if runtime == socketDirectory { #expect(path.hasPrefix("/tmp/tokenbroker-exec-")) }
            let parent = String(path[..<(path.lastIndex(of: "/") ?? path.endIndex)])
            #expect(!FileManager.default.fileExists(atPath: parent), "the directory is removed with the file")
        }
        // The broker down: nothing is run.
        await bridge.stop()
        let down = try await bridge.run(["exec", "api", "--", "true"])
        #expect(down.status == 3)
        bridge.expectNoSecretInOutputs()
    }
}
