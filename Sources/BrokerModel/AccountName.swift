/// The name of an account: 1 to 128 characters from `A-Z a-z 0-9 . _ - @`, checked once,
/// where a name comes in.
public struct AccountName: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: String

    /// `text` as an account name; `invalid` when it breaks the rule above.
    public init(_ text: String) throws(BrokerFailure) {
        let allowed = text.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == 0x2E || byte == 0x5F || byte == 0x2D || byte == 0x40
        }
        guard allowed, (1...128).contains(text.utf8.count) else {
            throw .invalid("account names are 1-128 characters of A-Z a-z 0-9 . _ - @")
        }
        rawValue = text
    }

    /// A name the broker already holds (a record's), which was checked when it came in.
    package init(known text: String) { rawValue = text }

    public var description: String { rawValue }

    public static func < (lhs: AccountName, rhs: AccountName) -> Bool { lhs.rawValue < rhs.rawValue }
}
