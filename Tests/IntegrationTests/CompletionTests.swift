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
            let added = try await broker.brokerctl(
                ["add", name, "--kind", "static", "--secrets", "-"], stdin: #"{"access_token":"t","expires_in":600}"#)
            #expect(added.status == 0, "\(added.stderr)")
        }
        let script = try Self.bashScript(in: broker.root)
        let complete = { (words: [String]) in try Self.complete(words, script: script, socket: broker.socketPath) }
        #expect(try complete(["token", "wo"]) == ["work", "work-ci"])
        #expect(try complete(["exec", "h"]) == ["home"])
        #expect(try complete(["status", ""]) == ["home", "work", "work-ci"])
        #expect(try complete(["add", "wo"]).isEmpty, "a new account's name is not completed")
        // Another socket on the line is asked instead: nothing answers there.
        #expect(
            try complete(["token", "--socket", broker.root.appendingPathComponent("none.sock").path, "wo"]).isEmpty)
    }

    /// Options with a fixed set of values complete them: `--kind`, `--flow`, `--client-auth`.
    @Test func optionValuesComplete() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("brokerctl-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let script = try Self.bashScript(in: directory)
        let socket = directory.appendingPathComponent("none.sock").path
        #expect(
            try Self.complete(["add", "api", "--kind", ""], script: script, socket: socket)
                == ["exec", "file", "oauth2", "refresh_url", "sliding", "static"])
        #expect(
            try Self.complete(["add", "api", "--kind", "s"], script: script, socket: socket) == ["sliding", "static"])
        #expect(
            try Self.complete(["login", "api", "--flow", ""], script: script, socket: socket) == ["browser", "device"])
        #expect(
            try Self.complete(["login", "api", "--client-auth", "client"], script: script, socket: socket)
                == ["client_secret_basic", "client_secret_post"])
    }

    /// brokerctl's bash completion script, written in `directory`.
    static func bashScript(in directory: URL) throws -> URL {
        let script = try ChildProcess.run(
            BrokerProcess.binary("brokerctl").path, ["completion", "bash"], environment: [:]
        ).output
        let file = directory.appendingPathComponent("brokerctl.bash")
        try script.write(to: file, atomically: true, encoding: .utf8)
        return file
    }

    /// What bash's Tab offers after `words` (the last one being completed), with `script`
    /// loaded and the broker at `socket`, sorted. bash calls the function with the command, the
    /// word being completed and the one before.
    static func complete(_ words: [String], script: URL, socket: String) throws -> [String] {
        let line = ([BrokerProcess.binary("brokerctl").path] + words).map { "'\($0)'" }.joined(separator: " ")
        let program = """
            source '\(script.path)'
            COMP_WORDS=(\(line)); COMP_CWORD=\(words.count); COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}
            _brokerctl "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
            printf '%s\\n' "${COMPREPLY[@]}"
            """
        let run = try ChildProcess.run(
            "/bin/bash", ["-c", program], environment: ["TOKENBROKER_SOCKET": socket, "PATH": "/usr/bin:/bin"])
        #expect(run.status == 0, "\(run.output)")
        return run.output.split(separator: "\n").map(String.init).sorted()
    }
}
