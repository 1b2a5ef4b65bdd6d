import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

struct Reload: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reload",
        abstract: "Make the broker re-read broker.toml (a broken file is refused and changes nothing).")

    @OptionGroup var options: GlobalOptions

    func run() throws {
        try options.run(.reload()) { "reloaded (\($0.accounts) accounts)" }
    }
}
