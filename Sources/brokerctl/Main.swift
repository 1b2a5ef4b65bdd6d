import ArgumentParser
import BrokerClient
import BrokerProtocol

#if canImport(Glibc)
import Glibc
#endif

/// brokerctl's entry: the usual `token` call on its own short path, everything else through
/// ArgumentParser. Run as `git-credential-tokenbroker` or `docker-credential-tokenbroker` (the
/// names git and docker look for on PATH), it is that helper.
@main
enum Main {
    /// The helper an installed name runs, if it is one. A `switch`, not a dictionary: a
    /// dictionary's first use looks up `String: Hashable` among every conformance of the binary,
    /// a tenth of `brokerctl token`'s CPU.
    static func helper(named name: String) -> String? {
        switch name {
        case "git-credential-tokenbroker": return "git-credential"
        case "docker-credential-tokenbroker": return "docker-credential"
        default: return nil
        }
    }

    static func main() {
        let arguments = CommandLine.arguments
        if let helper = arguments.first.flatMap({ helper(named: $0.baseName) }) {
            Brokerctl.main([helper] + arguments.dropFirst())
            return
        }
        if let call = TokenCall(arguments: arguments.dropFirst()) {
            exit(call.run())
        }
        if let command = arguments.dropFirst().first, let message = unknownCommand(command) {
            StandardStream.error.write(message)
            exit(ExitStatus.usage.rawValue)
        }
        Brokerctl.main()
    }

    /// The message for a first argument that names no subcommand (ArgumentParser would call it
    /// an unexpected argument), with the nearest one when a typo is likely; `nil` for a known
    /// subcommand, an option, or `help`.
    static func unknownCommand(_ command: String) -> String? {
        let names = Brokerctl.configuration.subcommands.map { $0._commandName } + ["help"]
        guard !command.hasPrefix("-"), !names.contains(command) else { return nil }
        let shown = JSONText.quote(String(command.prefix(64)))
        let nearest = Suggestion.nearest(to: command, among: names)
        return "brokerctl: unknown command \(shown)" + (nearest.map { "; did you mean \"\($0)\"?" } ?? "")
            + " (brokerctl --help lists the commands)\n"
    }
}

/// `brokerctl token ACCOUNT [--min-ttl SECONDS] [--socket PATH] [--timeout SECONDS]`, what
/// scripts run before every request, read without ArgumentParser: building its command tree
/// cost more CPU than the rest of the call (2.9 of 4.9 ms, measured with `perf record` over 300
/// calls). Only these plain forms are taken (values of digits and one `.`, each option once,
/// no `--json`, `--id-token`, `--help` or `--`); any other command line goes to ArgumentParser,
/// which reads it as before. The answer, the output and the exit codes are those of the `Token` command.
struct TokenCall {
    var account: String
    var minTTL: Double?
    var socket: String?
    var timeout = 120.0

    init?(arguments: ArraySlice<String>) {
        var arguments = arguments
        guard arguments.popFirst() == "token" else { return nil }
        var account: String?
        var seen: Set<String> = []
        while let argument = arguments.popFirst() {
            guard argument.hasPrefix("-") else {
                guard account == nil else { return nil }
                account = argument
                continue
            }
            guard seen.insert(argument).inserted, let value = arguments.popFirst(), !value.hasPrefix("-") else {
                return nil
            }
            switch argument {
            case "--socket": socket = value
            case "--min-ttl":
                guard let seconds = Self.seconds(value) else { return nil }
                minTTL = seconds
            case "--timeout":
                // One ArgumentParser refuses (with its usage text) is left to it.
                guard let seconds = Self.seconds(value), seconds > 0, seconds <= Bounds.maximumLifetime else {
                    return nil
                }
                timeout = seconds
            default: return nil
            }
        }
        guard let account else { return nil }
        self.account = account
    }

    /// Prints the token; returns the exit code.
    func run() -> Int32 {
        do {
            let token = try GlobalOptions.reportingFailures(account: account, socket: socket) {
                try GlobalOptions.client(socket: socket, timeout: timeout).accessToken(account: account, minTTL: minTTL)
            }
            StandardStream.output.write(token + "\n")
            return 0
        } catch let exit as ExitCode {
            return exit.rawValue
        } catch {
            StandardStream.error.write("Error: \(error)\n")
            return 1
        }
    }

    /// A plain decimal number of seconds (`60`, `0.5`); `nil` for any other text.
    private static func seconds(_ text: String) -> Double? {
        let dots = text.utf8.count { $0 == UInt8(ascii: ".") }
        guard dots <= 1, text.utf8.allSatisfy({ $0 == UInt8(ascii: ".") || (0x30...0x39).contains($0) }) else {
            return nil
        }
        return Double(text).flatMap { $0.isFinite ? $0 : nil }
    }
}
