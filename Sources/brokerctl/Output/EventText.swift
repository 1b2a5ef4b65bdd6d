import BrokerProtocol
import FoundationEssentials

/// How `watch` prints an event, and an account's state before the events.
enum EventText {
    static func human(_ event: BrokerEvent) -> String {
        var text = "\(Wire.rfc3339(event.at))  \(padded(event.event.rawValue, to: 14))  \(event.account)"
        if let expiresAt = event.expiresAt { text += "  expires \(Wire.rfc3339(expiresAt))" }
        if let message = event.message { text += "  \(message)" }
        return text
    }

    static func json(_ event: BrokerEvent) -> String {
        (try? Wire.makeEncoder().encode(event)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    /// `at  state  ACCOUNT  STATE  expires …  last error`.
    static func human(_ account: AccountStatus, at now: Date) -> String {
        var text = "\(Wire.rfc3339(now))  \(padded("state", to: 14))  \(account.account)  \(account.state)"
        if let expiresAt = account.expiresAt { text += "  expires \(Wire.rfc3339(expiresAt))" }
        if let message = account.lastError?.message { text += "  \(message)" }
        return text
    }

    /// `{"state", "account", "at", "expires_at"?, "message"?}`: no `event`, so it reads apart from events.
    static func json(_ account: AccountStatus, at now: Date) -> String {
        let line = StateLine(
            state: account.state, account: account.account, at: now, expiresAt: account.expiresAt,
            message: account.lastError?.message)
        return (try? Wire.makeEncoder().encode(line)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    private struct StateLine: Encodable {
        var state: String
        var account: String
        var at: Date
        var expiresAt: Date?
        var message: String?

        enum CodingKeys: String, CodingKey {
            case state, account, at, message
            case expiresAt = "expires_at"
        }
    }
}
