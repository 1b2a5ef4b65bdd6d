import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// ISO 8601 date-times as sliding endpoints send them: `2026-01-06T14:18:40`, with optional
/// fractional seconds (any number of digits, as .NET writes seven) and an optional zone (`Z`,
/// `+05:30`, `+0530`, `+05`). A time without a zone is read in `defaultZone`.
package enum Timestamp {
    package static func parse(_ text: String, defaultZone: IANATimeZone) -> Date? {
        var scanner = Substring(text.trimmingSpaces())
        guard let year = scanner.number(digits: 4), scanner.take("-"), let month = scanner.number(digits: 2),
            scanner.take("-"), let day = scanner.number(digits: 2),
            scanner.take("T") || scanner.take("t")
                || scanner.take(" "),
            let hour = scanner.number(digits: 2), scanner.take(":"), let minute = scanner.number(digits: 2),
            scanner.take(":"), let second = scanner.number(digits: 2)
        else { return nil }
        var fraction = 0.0
        if scanner.take(".") || scanner.take(",") {
            let digits = scanner.prefix { $0.isASCII && $0.isNumber }
            guard !digits.isEmpty, let value = Double("0." + digits) else { return nil }
            fraction = value
            scanner = scanner.dropFirst(digits.count)
        }
        var offset: Int?
        if scanner.take("Z") || scanner.take("z") {
            offset = 0
        } else if let sign = scanner.first, sign == "+" || sign == "-" {
            scanner = scanner.dropFirst()
            guard let hours = scanner.number(digits: 2), hours <= 23 else { return nil }
            _ = scanner.take(":")
            let minutes = scanner.isEmpty ? 0 : scanner.number(digits: 2)
            guard let minutes, minutes <= 59 else { return nil }
            offset = (hours * 3600 + minutes * 60) * (sign == "-" ? -1 : 1)
        }
        guard scanner.isEmpty, (1...12).contains(month), hour <= 23, minute <= 59, second <= 60,
            (1...CivilDate.daysIn(month: month, year: Int64(year))).contains(day)  // refuses 2026-02-31
        else { return nil }
        let days = CivilDate.days(year: Int64(year), month: month, day: day)
        let wallClock = Date(
            timeIntervalSince1970: Double(days * 86_400 + Int64(hour * 3600 + minute * 60 + min(second, 59))))
        let date = offset.map { wallClock.addingTimeInterval(-Double($0)) } ?? defaultZone.date(wallClock: wallClock)
        return date.addingTimeInterval(fraction + (second == 60 ? 1 : 0))
    }
}

extension Substring {
    /// Consumes `literal` if the text starts with it.
    fileprivate mutating func take(_ literal: String) -> Bool {
        guard hasPrefix(literal) else { return false }
        self = dropFirst(literal.count)
        return true
    }

    /// Consumes exactly `digits` ASCII digits and returns their value.
    fileprivate mutating func number(digits: Int) -> Int? {
        let head = prefix(digits)
        guard head.count == digits, head.allSatisfy({ $0.isASCII && $0.isNumber }), let value = Int(head) else {
            return nil
        }
        self = dropFirst(digits)
        return value
    }
}
