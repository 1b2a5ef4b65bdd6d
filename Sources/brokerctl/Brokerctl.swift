import ArgumentParser
import BrokerProtocol
import FoundationEssentials

/// brokerctl: inspect and manage brokerd, and fetch tokens in scripts.
struct Brokerctl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "brokerctl", abstract: "Inspect and manage tokenbroker; print tokens for scripts.",
        discussion: "Exit codes:\n" + ExitStatus.table.map { "  \($0.code) \($0.meaning)" }.joined(separator: "\n"),
        version: Release.version,
        subcommands: [
            Status.self, Token.self, Watch.self, Login.self, Add.self, SetTokens.self, Remove.self, Refresh.self,
            Logout.self, Reload.self, Unlock.self, Lock.self, Rekey.self, GitCredential.self, DockerCredential.self,
            KubeCredential.self, Exec.self, Header.self, Completion.self, Fleet.self, Share.self, Unshare.self,
            Update.self,
        ])
}
