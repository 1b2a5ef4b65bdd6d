import BrokerProtocol
import FoundationEssentials

/// The human form of `status`.
enum StatusTable {
    static func render(_ accounts: [AccountStatus], now: Date) -> String {
        guard !accounts.isEmpty else { return "no accounts" }
        var rows = [["ACCOUNT", "PROVIDER", "STATE", "EXPIRES IN", "NEXT REFRESH", "LAST ERROR"]]
        for account in accounts {
            rows.append([
                account.account, account.provider + (account.shared == true ? " (shared)" : ""),
                account.state.replacing("_", with: " "),
                account.expiresAt.map { duration($0.timeIntervalSince(now)) } ?? "-",
                account.nextRefreshAt.map { "in " + duration($0.timeIntervalSince(now)) } ?? "-",
                account.lastError?.message ?? "",
            ])
        }
        let widths = (0..<rows[0].count).map { column in rows.map { $0[column].count }.max() ?? 0 }
        return rows.map { row in
            var line = zip(row, widths).map { padded($0, to: $1) }.joined(separator: "  ")
            while line.last == " " { line.removeLast() }
            return line
        }.joined(separator: "\n")
    }

    /// For each account that serves no token or whose refreshes fail, the broker's advice (a
    /// command that works for that account, with `--socket` when one was given); each account
    /// whose scope the IdP narrowed; each account's DPoP key (and an IdP that issued bearer
    /// tokens to it); preceded by a blank line when there are any.
    static func hints(_ accounts: [AccountStatus], socket: String?) -> [String] {
        let socketOption = socket.map { " --socket " + ShellWord.quoted($0) } ?? ""
        let restore = accounts.compactMap { account in
            account.advice.map { advice in
                let command = account.adviceCommand ?? ""
                let shown = command.isEmpty ? advice : advice.replacing(command, with: command + socketOption)
                return "\(account.account): \(shown)"
            }
        }
        let narrowed = accounts.compactMap { account in
            account.lostScope.map { "\(account.account): the IdP no longer grants the scope \($0)" }
        }
        let dpop = accounts.compactMap { account in
            account.dpop.map { key in
                "\(account.account): DPoP \(key.algorithm), key thumbprint \(key.thumbprint)"
                    + (key.issuedTokenType.map { "; the IdP ignored it and issued a \($0) token" } ?? "")
            }
        }
        let hints = restore + narrowed + dpop
        return hints.isEmpty ? [] : [""] + hints
    }

    static func duration(_ seconds: TimeInterval) -> String {
        if seconds <= 0 { return "expired" }
        let whole = Bounds.wholeSeconds(seconds)
        if whole < 120 { return "\(whole)s" }
        if whole < 7200 { return "\(whole / 60)m" }
        if whole < 172800 { return "\(whole / 3600)h" }
        return "\(whole / 86400)d"
    }
}

/// `text` with spaces added up to `width` characters.
func padded(_ text: String, to width: Int) -> String {
    text + String(repeating: " ", count: max(0, width - text.count))
}
