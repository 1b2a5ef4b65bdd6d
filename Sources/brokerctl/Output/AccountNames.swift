import ArgumentParser
import BrokerClient
import BrokerProtocol

/// The account names the broker shows this caller (`status`: only the accounts it may use), for
/// a shell completing an account argument and for the "did you mean" of a mistyped name.
enum AccountNames {
    /// Completes an account argument from the broker at the line's `--socket` (else the default
    /// socket); nothing when the broker does not answer within a second.
    static let completion = CompletionKind.custom { words, _, prefix in
        visible(socket: socket(in: words), timeout: 1).filter { $0.hasPrefix(prefix) }
    }

    /// The names `status` at `socket` (the default when `nil`) lists, sorted; none when the
    /// broker cannot be asked within `timeout` seconds.
    static func visible(socket: String?, timeout: Double) -> [String] {
        let status = try? GlobalOptions.client(socket: socket, timeout: timeout).perform(.status())
        return (status?.accounts.map(\.account) ?? []).sorted()
    }

    /// The value of `--socket PATH` or `--socket=PATH` among the words of a command line.
    static func socket(in words: [String]) -> String? {
        for (index, word) in words.enumerated() {
            if word == "--socket", index + 1 < words.count { return words[index + 1] }
            if word.hasPrefix("--socket=") { return String(word.dropFirst("--socket=".count)) }
        }
        return nil
    }
}
