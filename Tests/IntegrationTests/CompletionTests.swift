import Foundation
import TestSupport
import Testing

/// `brokerctl completion bash|zsh|fish`: the scripts the Debian package installs (README, "Install").
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
}
