@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Testing
import TestSupport

/// The TOML subset `broker.toml` is read with: what it reads, what it means, and what it refuses.
@Suite struct TOMLTests {
    private func value(_ text: String) throws -> TOMLValue? {
        try TOMLTable(parsing: "v = \(text)\n")["v"]
    }

    private func refusal(_ text: String) -> TOMLError? {
        #expect(throws: TOMLError.self) { try TOMLTable(parsing: text) }
    }

    @Test func aConfigInEveryStyleIsRead() throws {
        let text = """
            # settings
            [broker]
            refresh_fraction = 0.5   # a comment
            event_buffer = 1_024

            [ accounts . "my api" ]
            kind = 'oauth2'
            command = [
              "/bin/get-token",  # the program
              "--profile", 'work',
            ]

            [accounts]
            inline = { kind = "static", scope = "a b" }
            """
        let table = try TOMLTable(parsing: text)
        #expect(table.keys == ["broker", "accounts"])
        #expect(table["broker"]?.table?["refresh_fraction"] == .float(0.5))
        #expect(table["broker"]?.table?["event_buffer"] == .integer(1024))
        let accounts = try #require(table["accounts"]?.table)
        #expect(accounts.keys == ["my api", "inline"])
        #expect(accounts["my api"]?.table?["kind"]?.string == "oauth2")
        #expect(
            accounts["my api"]?.table?["command"]
                == .array([.string("/bin/get-token"), .string("--profile"), .string("work")]))
        #expect(accounts["inline"]?.table?["scope"]?.string == "a b")
    }

    @Test(arguments: [
        ("0", TOMLValue.integer(0)), ("+17", .integer(17)), ("-17", .integer(-17)), ("1_000_000", .integer(1_000_000)),
        ("0xDEAD_beef", .integer(0xDEAD_BEEF)), ("0o755", .integer(0o755)), ("0b1101", .integer(13)),
        ("9223372036854775807", .integer(.max)), ("1.5", .float(1.5)), ("-0.25", .float(-0.25)), ("1e3", .float(1000)),
        ("6.25E-2", .float(0.0625)), ("1_0.0_1", .float(10.01)), ("inf", .float(.infinity)),
        ("-inf", .float(-.infinity)),
        ("true", .boolean(true)), ("false", .boolean(false)), ("[]", .array([])),
        ("[ 1, [2, 'x'] ]", .array([.integer(1), .array([.integer(2), .string("x")])])),
    ])
    func scalarsAndArrays(text: String, expected: TOMLValue) throws {
        #expect(try value(text) == expected)
    }

    @Test func nanIsAFloat() throws {
        #expect(try value("nan")?.double?.isNaN == true)
        #expect(try value("-nan")?.double?.isNaN == true)
    }

    @Test(arguments: [
        (#""a\tb\n\"q\" \\ \u00e9 \U0001F600""#, "a\tb\n\"q\" \\ é 😀"),
        (#"'C:\path\no escapes'"#, #"C:\path\no escapes"#),
        ("\"\"\"\nline one\nline two\"\"\"", "line one\nline two"),
        ("\"\"\"joined \\\n    together\"\"\"", "joined together"),
        ("'''\nraw \\n ''text'''''", "raw \\n ''text''"),
        ("\"\"\"a \"quoted\" \"\"word\"\"\"\"\"", "a \"quoted\" \"\"word\"\""),
        ("\"ünïcödé\"", "ünïcödé"),
    ])
    func strings(text: String, expected: String) throws {
        #expect(try value(text) == .string(expected))
    }

    @Test func windowsLineEndingsAreRead() throws {
        let table = try TOMLTable(parsing: "[broker]\r\nrefresh_floor = 30 # c\r\n\r\nx = \"\"\"a\r\nb\"\"\"\r\n")
        #expect(table["broker"]?.table?["refresh_floor"] == .integer(30))
        #expect(table["broker"]?.table?["x"] == .string("a\r\nb"))
    }

    /// Each text is wrong on the line given (1-based), and says what is wrong.
    @Test(arguments: [
        ("a = 1\na = 2\n", 2, "defined twice"),
        ("[t]\n[t]\n", 2, "defined twice"),
        ("[a.b]\n[a]\n[a.b]\n", 3, "defined twice"),
        ("a = 1\n[a.b]\n", 2, "already defined"),
        ("[x]\nt = { k = 1 }\n[x.t]\n", 3, "already defined"),
        ("a.b = 1\n", 1, "dotted keys"),
        ("t = { a.b = 1 }\n", 1, "dotted keys"),
        ("[[servers]]\n", 1, "arrays of tables"),
        ("d = 1979-05-27\n", 1, "dates"),
        ("d = 07:32:00\n", 1, "dates"),
        ("t = { a = 1, a = 2 }\n", 1, "defined twice"),
        ("t = { a = 1,\n b = 2 }\n", 1, "expected"),
        ("t = { a = 1, }\n", 1, "expected a key"),
        ("s = \"open\nx = 1\n", 1, "not closed"),
        ("s = '''\nnever closed\n", 1, "not closed"),
        ("s = \"\\q\"\n", 1, "unknown escape"),
        ("s = \"\\uD800\"\n", 1, "no Unicode character"),
        ("s = \"tab\u{7}bell\"\n", 1, "control character"),
        ("# bell \u{7}\n", 1, "control character"),
        ("x = 1 2\n", 1, "end of the line"),
        ("x = \n", 1, "expected a value"),
        ("x = [1 2]\n", 1, "expected , or ]"),
        ("= 1\n", 1, "expected a key"),
        ("x 1\n", 1, "expected ="),
        ("x = 1\r2\n", 1, "carriage return"),
    ])
    func refusedWithTheLine(text: String, line: Int, reason: String) throws {
        let error = try #require(refusal(text))
        #expect(error.line == line, "\(error)")
        #expect(error.reason.contains(reason), "\(error)")
    }

    @Test(arguments: [
        "00", "012", "+0x1", "0x", "1__0", "_1", "1_", "1.", ".5", "1.e5", "1e", "1e+", "01.5", "9223372036854775808",
        "0xG", "0b102", "True", "1.5.5", "--1",
    ])
    func malformedNumbersAreRefused(text: String) {
        #expect(refusal("v = \(text)\n") != nil)
    }

    @Test func deepNestingIsRefusedNotRecursedInto() throws {
        let error = try #require(refusal("v = " + String(repeating: "[", count: 10_000) + "\n"))
        #expect(error.reason.contains("nested too deeply"))
        _ = try value(String(repeating: "[", count: 31) + String(repeating: "]", count: 31))
    }

    /// Text made of TOML's own pieces in random order (a fixed seed, so a failure replays) is
    /// read or refused with a line that is in the text; the reader never traps.
    @Test func randomTextIsReadOrRefusedByALineOfIt() {
        let pieces = [
            "[", "]", "[[", "{", "}", "=", ",", ".", "\"", "'", "\"\"\"", "'''", "\\", "\\u", "\n", "\r\n", "\r", " ",
            "\t", "#", "a", "key", "1", "0x", "0b", "e", "-", "+", "_", "true", "inf", "nan", "1.5", "é", "\u{0}", ":",
        ]
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(bound))
        }
        var refused = 0
        for _ in 0..<20_000 {
            let text = (0..<next(40)).map { _ in pieces[next(pieces.count)] }.joined()
            do {
                _ = try TOMLTable(parsing: text)
            } catch {
                refused += 1
                let lines = text.utf8.filter { $0 == UInt8(ascii: "\n") }.count + 1
                #expect((1...lines).contains(error.line), "\(text.debugDescription): \(error)")
            }
        }
        #expect(refused > 0)
    }
}
