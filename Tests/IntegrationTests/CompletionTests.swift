import Foundation
import TestSupport
import Testing

/// `brokerctl completion bash|zsh|fish`: the scripts the Debian package installs (docs/install.md).
@Suite struct CompletionTests {
    @Test(arguments: [
        ("bash", "-F _brokerctl brokerctl"), ("zsh", "#compdef brokerctl"), ("fish", "complete -c 'brokerctl'"),
    ])
    func eachShellGetsItsScript(shell: String, marker: String) throws {
        let brokerctl = BrokerProcess.binary("brokerctl").path
        let (status, script) = try ChildProcess.run(brokerctl, ["completion", shell], environment: [:])
        #expect(status == 0, "\(script)")
        #expect(script.contains(marker), "\(script.prefix(300))")
        #expect(script.contains("set-tokens") && script.contains("git-credential"))
        if shell == "bash" {
            let file = FileManager.default.temporaryDirectory.appendingPathComponent("brokerctl-\(UUID()).bash")
            try script.write(to: file, atomically: true, encoding: .utf8)
            defer { try? FileManager.default.removeItem(at: file) }
            let syntax = try ChildProcess.run("/bin/bash", ["-n", file.path], environment: [:])
            #expect(syntax.status == 0, "\(syntax.output)")
        }
    }

    @Test func anUnknownShellIsAUsageError() throws {
        let (status, output) = try ChildProcess.run(
            BrokerProcess.binary("brokerctl").path, ["completion", "tcsh"], environment: [:])
        #expect(status == 64, "\(output)")
    }

    /// Account arguments complete from the names `status` shows, in bash through the installed
    /// script (as a user's Tab would), for commands that take an account; `add` takes a new one.
    @Test func accountArgumentsCompleteFromTheBrokersAccounts() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        for name in ["work", "work-ci", "home"] {
            let added = try broker.brokerctl(
                ["add", name, "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"t","expires_in":600}"#)
            #expect(added.status == 0, "\(added.stderr)")
        }
        let brokerctl = BrokerProcess.binary("brokerctl").path
        let script = try ChildProcess.run(brokerctl, ["completion", "bash"], environment: [:]).output
        let file = broker.root.appendingPathComponent("brokerctl.bash")
        try script.write(to: file, atomically: true, encoding: .utf8)
        /// What bash's Tab offers after `words` (the last one being completed).
        func complete(_ words: [String]) throws -> [String] {
            let line = ([brokerctl] + words).map { "'\($0)'" }.joined(separator: " ")
            let program = """
                source '\(file.path)'
                COMP_WORDS=(\(line)); COMP_CWORD=\(words.count); COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}
                _brokerctl; printf '%s\\n' "${COMPREPLY[@]}"
                """
            let run = try ChildProcess.run(
                "/bin/bash", ["-c", program],
                environment: ["TOKENBROKER_SOCKET": broker.socketPath, "PATH": "/usr/bin:/bin"])
            #expect(run.status == 0, "\(run.output)")
            return run.output.split(separator: "\n").map(String.init).sorted()
        }
        #expect(try complete(["token", "wo"]) == ["work", "work-ci"])
        #expect(try complete(["exec", "h"]) == ["home"])
        #expect(try complete(["status", ""]) == ["home", "work", "work-ci"])
        #expect(try complete(["add", "wo"]).isEmpty, "a new account's name is not completed")
        // Another socket on the line is asked instead: nothing answers there.
        #expect(
            try complete(["token", "--socket", broker.root.appendingPathComponent("none.sock").path, "wo"]).isEmpty)
    }
}
