@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Time zones read from the system's tz database, checked against Foundation's ICU zones
/// (linked into this test process only) and against dates worked out by hand.
@Suite struct IANATimeZoneTests {
    /// `2026-07-01T12:00:00Z` and the like, as a date.
    static func utc(_ text: String) -> Date { ISO8601DateFormatter().date(from: text)! }

    /// The wall-clock reading `text` (no zone), written as if it were UTC.
    static func wallClock(_ text: String) -> Date { utc(text + "Z") }

    @Test(arguments: [
        ("Europe/Berlin", "2026-01-06T12:00:00", "2026-01-06T11:00:00Z"),
        ("Europe/Berlin", "2026-07-01T12:00:00", "2026-07-01T10:00:00Z"),
        // Clocks go forward at 02:00 on 2026-03-29: 02:30 never happens; it is read with the
        // offset from before (+1), which is 03:30 summer time.
        ("Europe/Berlin", "2026-03-29T02:30:00", "2026-03-29T01:30:00Z"),
        // Clocks go back at 03:00 on 2026-10-25: 02:30 happens twice; the earlier one is taken.
        ("Europe/Berlin", "2026-10-25T02:30:00", "2026-10-25T00:30:00Z"),
        // Beyond the file's transitions (2037): its footer rule says.
        ("Europe/Berlin", "2045-07-01T12:00:00", "2045-07-01T10:00:00Z"),
        ("America/New_York", "2050-01-15T12:00:00", "2050-01-15T17:00:00Z"),
        ("America/New_York", "2050-07-15T12:00:00", "2050-07-15T16:00:00Z"),
        // Southern summer spans the new year.
        ("Australia/Sydney", "2060-01-15T12:00:00", "2060-01-15T01:00:00Z"),
        ("Australia/Sydney", "2060-07-15T12:00:00", "2060-07-15T02:00:00Z"),
        ("Asia/Tokyo", "2026-01-06T14:18:40", "2026-01-06T05:18:40Z"),
        ("America/Sao_Paulo", "2026-01-06T12:00:00", "2026-01-06T15:00:00Z"),
        ("Asia/Kolkata", "2026-01-06T12:00:00", "2026-01-06T06:30:00Z"),
        ("UTC", "2026-01-06T12:00:00", "2026-01-06T12:00:00Z"),
    ])
    func wallClockReadingsBecomeInstants(zone: String, reading: String, instant: String) throws {
        let timeZone = try #require(IANATimeZone(identifier: zone))
        #expect(timeZone.date(wallClock: Self.wallClock(reading)) == Self.utc(instant))
    }

    /// Every six hours over seventy years, the instant found for a reading shows that reading
    /// in ICU's zone too, and no earlier instant does.
    @Test(arguments: ["Europe/Berlin", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe", "Europe/London"])
    func agreesWithICU(zone: String) throws {
        let timeZone = try #require(IANATimeZone(identifier: zone))
        let icu = try #require(TimeZone(identifier: zone))
        var instant = Self.utc("1990-01-01T00:00:00Z")
        let end = Self.utc("2060-01-01T00:00:00Z")
        var mismatches: [String] = []
        while instant < end, mismatches.count < 5 {
            let reading = instant.addingTimeInterval(Double(icu.secondsFromGMT(for: instant)))
            let found = timeZone.date(wallClock: reading)
            let shown = found.addingTimeInterval(Double(icu.secondsFromGMT(for: found)))
            if shown != reading || found > instant { mismatches.append("\(reading) -> \(found) for \(instant)") }
            instant.addTimeInterval(6 * 3600 + 17 * 60)
        }
        #expect(mismatches.isEmpty, "\(mismatches)")
    }

    @Test(arguments: [
        "", "../etc/passwd", "/etc/localtime", "Europe/../../etc/passwd", "Europe//Berlin", "Europe/Berlin/",
        "Nowhere/City", "Europe/Berlin\u{0}", "-Europe", ".", "Europe/Berlin ", "Éurope/Berlin",
    ])
    func namesOutsideTheDatabaseAreRefused(name: String) {
        #expect(IANATimeZone(identifier: name) == nil)
    }

    @Test func utcNeedsNoDatabase() throws {
        for name in ["UTC", "Etc/UTC", "GMT", "Etc/GMT"] {
            let zone = try #require(IANATimeZone(identifier: name, database: "/nonexistent"))
            #expect(zone.date(wallClock: Self.wallClock("2026-01-06T12:00:00")) == Self.utc("2026-01-06T12:00:00Z"))
        }
    }

    @Test func aDatabaseFileOthersCanWriteOrATruncatedOneIsRefused() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let original = try Data(contentsOf: URL(fileURLWithPath: IANATimeZone.systemDatabase + "/Europe/Berlin"))
        try original.write(to: URL(fileURLWithPath: directory.file("Berlin")))
        chmod(directory.file("Berlin"), 0o644)
        #expect(IANATimeZone(identifier: "Berlin", database: directory.path) != nil, "a copy of root's, 0644, is read")
        chmod(directory.file("Berlin"), 0o666)
        #expect(IANATimeZone(identifier: "Berlin", database: directory.path) == nil, "others could write it")
        for length in [0, 10, 44, original.count / 2, original.count - 2] {
            try original.prefix(length).write(to: URL(fileURLWithPath: directory.file("Cut")))
            chmod(directory.file("Cut"), 0o644)
            #expect(IANATimeZone(identifier: "Cut", database: directory.path) == nil, "cut at \(length)")
        }
    }
}

/// The POSIX `TZ` rules TZif files end with.
@Suite struct POSIXZoneRuleTests {
    static func instant(_ text: String) -> Int64 { Int64(IANATimeZoneTests.utc(text).timeIntervalSince1970) }

    @Test(arguments: [
        ("CET-1CEST,M3.5.0,M10.5.0/3", "2040-03-25T00:59:59Z", 3600),
        ("CET-1CEST,M3.5.0,M10.5.0/3", "2040-03-25T01:00:00Z", 7200),
        ("CET-1CEST,M3.5.0,M10.5.0/3", "2040-10-28T00:59:59Z", 7200),
        ("CET-1CEST,M3.5.0,M10.5.0/3", "2040-10-28T01:00:00Z", 3600),
        ("EST5EDT,M3.2.0,M11.1.0", "2041-03-10T06:59:59Z", -18000),
        ("EST5EDT,M3.2.0,M11.1.0", "2041-03-10T07:00:00Z", -14400),
        ("<-03>3", "2050-06-01T00:00:00Z", -10800),
        ("<+0530>-5:30", "2050-06-01T00:00:00Z", 19800),
        // Lord Howe: half an hour of daylight saving, southern summer.
        ("<+1030>-10:30<+11>-11,M10.1.0,M4.1.0", "2050-01-01T00:00:00Z", 39600),
        ("<+1030>-10:30<+11>-11,M10.1.0,M4.1.0", "2050-07-01T00:00:00Z", 37800),
        // Greenland's rule: changes at -1:00 and 0:00 local time.
        ("<-02>2<-01>,M3.5.0/-1,M10.5.0/0", "2050-03-27T00:59:59Z", -7200),
        ("<-02>2<-01>,M3.5.0/-1,M10.5.0/0", "2050-03-27T01:00:00Z", -3600),
        // Julian days skip February 29; zero-based days count it.
        ("AAA0BBB,J60/0,J300/0", "2040-02-29T12:00:00Z", 0),
        ("AAA0BBB,J60/0,J300/0", "2040-03-01T00:00:00Z", 3600),
        ("AAA0BBB,59/0,300/0", "2040-02-29T00:00:00Z", 3600),
    ])
    func offsets(rule: String, at instant: String, offset: Int32) throws {
        let parsed = try #require(POSIXZoneRule(rule))
        #expect(parsed.offset(at: Self.instant(instant)) == offset)
    }

    @Test(arguments: [
        "", "CE-1", "CET", "CET-1CEST", "CET-1CEST,M3.5.0", "CET-1CEST,M13.5.0,M10.5.0", "CET-1CEST,M3.6.0,M10.5.0",
        "CET-1CEST,M3.5.7,M10.5.0", "CET-1CEST,J0,J365", "CET-1CEST,366,1", "CET-25", "CET-1CEST,M3.5.0/168,M10.5.0",
        "<AB>1", "CET-1 ", "CET-1:60",
    ])
    func malformedRulesAreRefused(rule: String) {
        #expect(POSIXZoneRule(rule) == nil)
    }
}
