import Foundation

/// ISO 8601 date-times as IdPs and helpers write them (sliding endpoints, `exec` commands,
/// token files; `Retry-After` dates are read through it too): `2026-01-06T14:18:40`, with
/// optional fractional seconds (any number of digits, as .NET writes seven) and an optional zone
/// (`Z`, `+05:30`, `+0530`, `+05`). A time without a zone is read in `defaultZone`.
enum Timestamp {
    static func parse(_ text: String, defaultZone: TimeZone) -> Date? {
        var scanner = Substring(text.trimmingCharacters(in: .whitespaces))
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
        var zone = defaultZone
        if scanner.take("Z") || scanner.take("z") {
            zone = TimeZone(secondsFromGMT: 0)!
        } else if let sign = scanner.first, sign == "+" || sign == "-" {
            scanner = scanner.dropFirst()
            guard let hours = scanner.number(digits: 2), hours <= 23 else { return nil }
            _ = scanner.take(":")
            let minutes = scanner.isEmpty ? 0 : scanner.number(digits: 2)
            guard let minutes, minutes <= 59 else { return nil }
            let offset = (hours * 3600 + minutes * 60) * (sign == "-" ? -1 : 1)
            guard let fixed = TimeZone(secondsFromGMT: offset) else { return nil }
            zone = fixed
        }
        guard scanner.isEmpty, (1...12).contains(month), (1...31).contains(day), hour <= 23, minute <= 59,
            second <= 60
        else { return nil }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = zone
        let components = DateComponents(
            year: year, month: month, day: day, hour: hour, minute: minute, second: min(second, 59))
        guard let date = calendar.date(from: components),
            calendar.component(.day, from: date) == day  // refuses 2026-02-31 instead of rolling over
        else { return nil }
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
