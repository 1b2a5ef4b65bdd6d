import ArgumentParser

/// `brokerctl completion bash|zsh|fish`: the completion script of a shell, which the Debian
/// package installs where each shell looks (docs/install.md).
struct Completion: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the shell completion script for bash, zsh or fish.",
        discussion: "e.g. brokerctl completion bash > ~/.local/share/bash-completion/completions/brokerctl")

    /// The shells ArgumentParser writes scripts for.
    enum Shell: String, ExpressibleByArgument, CaseIterable {
        case bash, zsh, fish
    }

    @Argument(help: "bash, zsh or fish.")
    var shell: Shell

    func run() throws {
        let kind: CompletionShell =
            switch shell {
            case .bash: .bash
            case .zsh: .zsh
            case .fish: .fish
            }
        print(Brokerctl.completionScript(for: kind), terminator: "")
    }
}
