import BrokerModel
import BrokerProtocol
import BrokerSecrets

/// A POSIX `TZ` rule such as `CET-1CEST,M3.5.0,M10.5.0/3`, as TZif files end with (RFC 8536
/// section 3.3): the offsets of the years after the file's last transition. Offsets are kept
/// as seconds east of UTC (POSIX writes them west, hence `CET-1` for UTC+1).
package struct POSIXZoneRule: Sendable, Equatable {
    /// The day a change happens on, and the local time of day (seconds, -167 h to 167 h).
    package struct Change: Sendable, Equatable {
        package enum Day: Sendable, Equatable {
            /// `Jn`: day 1 to 365, February 29 never counted.
            case julian(Int)
            /// `n`: day 0 to 365, February 29 counted.
            case zeroBased(Int)
            /// `Mm.w.d`: weekday `d` (0 is Sunday) of week `w` (5 is the last) of month `m`.
            case weekday(month: Int, week: Int, weekday: Int)
        }

        package var day: Day
        package var time: Int64
    }

    /// Daylight-saving time: its offset, and when it starts and ends each year.
    package struct Daylight: Sendable, Equatable {
        package var offset: Int32
        package var start: Change
        package var end: Change
    }

    package var standardOffset: Int32
    /// `nil` for a zone without daylight-saving time.
    package var daylight: Daylight?

    /// Parses `text`; `nil` unless all of it is a rule (a daylight name needs its start and end).
    package init?(_ text: String) {
        var scanner = RuleScanner(bytes: Array(text.utf8))
        guard scanner.name(), let standard = scanner.offset(maximumHours: 24) else { return nil }
        standardOffset = Int32(-standard)
        guard !scanner.atEnd else { return }
        guard scanner.name() else { return nil }
        var daylightOffset = standardOffset + 3600
        if !scanner.atEnd && scanner.peek != UInt8(ascii: ",") {
            guard let offset = scanner.offset(maximumHours: 24) else { return nil }
            daylightOffset = Int32(-offset)
        }
        guard scanner.take(","), let start = scanner.change(), scanner.take(","), let end = scanner.change(),
            scanner.atEnd
        else { return nil }
        daylight = Daylight(offset: daylightOffset, start: start, end: end)
    }

    /// Seconds east of UTC at `instant` (seconds since 1970).
    package func offset(at instant: Int64) -> Int32 {
        guard let daylight else { return standardOffset }
        let days = instant >= 0 ? instant / 86_400 : (instant - 86_399) / 86_400
        let year = CivilDate.year(days: days)
        let yearStart = CivilDate.days(year: year, month: 1, day: 1) * 86_400
        // Both changes happen at a local time: the start's in standard time, the end's in daylight time.
        let start = yearStart + daylight.start.secondsIntoYear(year) - Int64(standardOffset)
        let end = yearStart + daylight.end.secondsIntoYear(year) - Int64(daylight.offset)
        let inDaylight = start < end ? (start <= instant && instant < end) : !(end <= instant && instant < start)
        return inDaylight ? daylight.offset : standardOffset
    }
}

extension POSIXZoneRule.Change {
    /// Local seconds from the start of `year` to this change.
    package func secondsIntoYear(_ year: Int64) -> Int64 {
        let leap = CivilDate.isLeap(year)
        let dayOfYear: Int64
        switch day {
        case .julian(let day): dayOfYear = Int64(day - 1) + (leap && day >= 60 ? 1 : 0)
        case .zeroBased(let day): dayOfYear = Int64(day)
        case .weekday(let month, let week, let weekday):
            let first = CivilDate.days(year: year, month: month, day: 1)
            // 1970-01-01 was a Thursday (4).
            let firstWeekday = Int(((first + 4) % 7 + 7) % 7)
            var day = 1 + (weekday - firstWeekday + 7) % 7 + (week - 1) * 7
            while day > CivilDate.daysIn(month: month, year: year) { day -= 7 }
            dayOfYear = first + Int64(day - 1) - CivilDate.days(year: year, month: 1, day: 1)
        }
        return dayOfYear * 86_400 + time
    }
}

/// Reads the parts of a POSIX `TZ` rule.
private struct RuleScanner {
    let bytes: [UInt8]
    var index = 0

    var atEnd: Bool { index == bytes.count }
    var peek: UInt8? { atEnd ? nil : bytes[index] }

    mutating func take(_ literal: Character) -> Bool {
        guard let byte = peek, let ascii = literal.asciiValue, byte == ascii else { return false }
        index += 1
        return true
    }

    /// A zone abbreviation: three or more letters, or `<...>` of letters, digits, `+` and `-`.
    mutating func name() -> Bool {
        let start = index
        if take("<") {
            while let byte = peek, Self.isAlphanumeric(byte) || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "-") {
                index += 1
            }
            return index - start - 1 >= 3 && take(">")
        }
        while let byte = peek, Self.isLetter(byte) { index += 1 }
        return index - start >= 3
    }

    /// `[+-]hh[:mm[:ss]]` in seconds, hours at most `maximumHours`.
    mutating func offset(maximumHours: Int64) -> Int64? {
        let negative = take("-")
        if !negative { _ = take("+") }
        guard let hours = number(maximumDigits: 3), hours <= maximumHours else { return nil }
        var seconds = hours * 3600
        if take(":") {
            guard let minutes = number(maximumDigits: 2), minutes <= 59 else { return nil }
            seconds += minutes * 60
            if take(":") {
                guard let rest = number(maximumDigits: 2), rest <= 59 else { return nil }
                seconds += rest
            }
        }
        return negative ? -seconds : seconds
    }

    /// `date[/time]`; the time defaults to 02:00.
    mutating func change() -> POSIXZoneRule.Change? {
        let day: POSIXZoneRule.Change.Day
        if take("J") {
            guard let number = number(maximumDigits: 3), (1...365).contains(number) else { return nil }
            day = .julian(Int(number))
        } else if take("M") {
            guard let month = number(maximumDigits: 2), (1...12).contains(month), take("."),
                let week = number(maximumDigits: 1), (1...5).contains(week), take("."),
                let weekday = number(maximumDigits: 1), weekday <= 6
            else { return nil }
            day = .weekday(month: Int(month), week: Int(week), weekday: Int(weekday))
        } else {
            guard let number = number(maximumDigits: 3), number <= 365 else { return nil }
            day = .zeroBased(Int(number))
        }
        guard take("/") else { return POSIXZoneRule.Change(day: day, time: 7200) }
        guard let time = offset(maximumHours: 167) else { return nil }
        return POSIXZoneRule.Change(day: day, time: time)
    }

    private mutating func number(maximumDigits: Int) -> Int64? {
        var value: Int64 = 0
        var digits = 0
        while digits < maximumDigits, let byte = peek, byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") {
            value = value * 10 + Int64(byte - UInt8(ascii: "0"))
            digits += 1
            index += 1
        }
        return digits == 0 ? nil : value
    }

    private static func isLetter(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
            || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
    }

    private static func isAlphanumeric(_ byte: UInt8) -> Bool {
        isLetter(byte) || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
    }
}
