@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Numbers, URLs, texts and descriptors at the broker's boundary (docs/security.md, "What brokerd
/// does not trust").
@Suite struct BoundaryUnitTests {
    @Test func lifetimesAreCheckedThenCut() {
        #expect(Bounds.lifetime(60) == 60)
        #expect(Bounds.lifetime(1e17) == Bounds.maximumLifetime)
        #expect(Bounds.lifetime(.greatestFiniteMagnitude) == Bounds.maximumLifetime)
        for bad in [-1, -0.001, .nan, .infinity, -.infinity] { #expect(Bounds.lifetime(bad) == nil) }
        #expect(Bounds.wholeSeconds(.nan) == 0)
        #expect(Bounds.wholeSeconds(-1e300) == -1_000_000_000_000)
        #expect(Bounds.milliseconds(1e300) == 1_000_000_000_000_000)
        #expect(Bounds.date(Date(timeIntervalSinceReferenceDate: .nan)) == Bounds.representableDates.lowerBound)
        #expect(Bounds.date(Date(timeIntervalSinceReferenceDate: 1e300)) == Bounds.representableDates.upperBound)
        #expect(Bounds.count(1e300, in: 1...10) == 10 && Bounds.count(.nan, in: 1...10) == 1)
    }

    @Test(arguments: [
        #"{"access_token":"a","expires_in":1e300}"#, #"{"access_token":"a","expires_in":"1e17"}"#,
        #"{"access_token":"a","expires_in":1.7976931348623157e308,"refresh_expires_in":1e300}"#,
    ])
    func hugeLifetimesFromAnIdPAreCut(body: String) throws {
        let now = Date(timeIntervalSince1970: 1_795_422_600)
        let grant = try OAuth2Provider.interpret(
            IdPReply(status: 200, body: Data(body.utf8)), now: now, defaultLifetime: 600
        ).get()
        #expect(grant.token.expiresAt == now.addingTimeInterval(Bounds.maximumLifetime))
        let exec = try ExecProvider.interpret(
            ExecOutput(ending: .exited(0), stdout: Data(body.utf8)), now: now, defaultLifetime: 600, timeout: 5
        ).get()
        #expect(exec.token.expiresAt == now.addingTimeInterval(Bounds.maximumLifetime))
    }

    @Test(arguments: [
        #"{"access_token":"a","expires_in":-1}"#, #"{"access_token":"a","expires_in":"inf"}"#,
        #"{"access_token":"a","expires_in":"nan"}"#, #"{"access_token":"a","expires_in":{}}"#,
        #"{"access_token":"a","refresh_expires_in":-1e300}"#,
    ])
    func malformedLifetimesFromAnIdPAreTransient(body: String) throws {
        let failure = try #require(
            OAuth2Provider.interpret(
                IdPReply(status: 200, body: Data(body.utf8)), now: Date(), defaultLifetime: 600
            ).failure)
        #expect(failure.kind == .transient)
    }

    @Test func retryAfterIsDigitsOrADateAndBounded() {
        #expect(IdPClient.retryAfter("120") == 120)
        #expect(IdPClient.retryAfter(String(repeating: "9", count: 400)) == Bounds.maximumLifetime)
        for bad in ["1e300", "inf", "nan", "-5", "0x10", "1.5", "f\u{6DF}", "Sun, 06 Nov 1994 08:49:37 G\u{6DF}MT"] {
            #expect(IdPClient.retryAfter(bad) == nil, "\(bad)")
        }
        #expect(IdPClient.httpDate("Sun, 06 Nov 1994 08:49:37 GMT") == Date(timeIntervalSince1970: 784_111_777))
        #expect(IdPClient.httpDate("Sun, 31 Feb 1994 08:49:37 GMT") == nil)
    }

    @Test(arguments: [
        "http://127.0.0.08/token", "http://127.000.0.1/token", "http://127.0.0.256/token", "http://127.1/token",
        "http://0x7f.0.0.1/token", "http://2130706433/token", "http://127.0.0.1./token", "https://idp.example:99999/t",
        "https://idp.example:0/t", "http://[::ffff:127.0.0.1]/t",
    ])
    func nonCanonicalLoopbackAndBadPortsAreRefused(url: String) throws {
        #expect(!EndpointPolicy.isAllowed(try #require(URL(string: url))))
    }

    @Test func anIdPNeverHandsOverADowngrade() throws {
        let https = try #require(URL(string: "https://login.example"))
        let loopback = try #require(URL(string: "http://127.0.0.1:8080/token"))
        #expect(!EndpointPolicy.isAllowed(loopback, handedOverBy: https))
        #expect(EndpointPolicy.isAllowed(loopback, handedOverBy: try #require(URL(string: "http://localhost:9"))))
        let document = #"{"token_endpoint":"http://127.0.0.1:8080/token"}"#
        let failure = try #require(
            DiscoveryCache.interpret(IdPReply(status: 200, body: Data(document.utf8)), issuer: https).failure)
        #expect(failure.kind == .transient)
        let badPort = #"{"token_endpoint":"https://login.example:99999/token"}"#
        #expect(DiscoveryCache.interpret(IdPReply(status: 200, body: Data(badPort.utf8)), issuer: https).failure != nil)
    }

    @Test(arguments: [
        "https://idp.example:99999/next", "https://idp.example:0/next", "http://idp.example/next",
        "https://idp.example.evil/next", "https://idp.example:8443/next", "https://user@evil.example/next",
    ])
    func aRotatedRefreshURLStaysOnItsOrigin(next: String) throws {
        let body = #"{"access_token":"a","refresh_url":"\#(next)"}"#
        let current = try #require(URL(string: "https://idp.example/r/1"))
        let failure = try #require(
            RefreshURLProvider.interpret(
                IdPReply(status: 200, body: Data(body.utf8)), from: current, now: Date(), defaultLifetime: 60
            ).failure)
        #expect(failure.kind == .denial)
        #expect(!failure.message.contains(next))
    }

    @Test(arguments: [
        ("connect_timeout = 1e300", 3), ("event_buffer = 1e300", 3), ("request_timeout = 0", 3),
        ("refresh_fraction = 1.5", 3), ("backoff_cap = nan", 3), ("default_lifetime = inf", 3),
        ("backoff_base = 0", 3), ("refresh_fraction = 0.6\nrefresh_jitter = 0.4", 4),
    ])
    func outOfRangeSettingsAreRefusedByLine(line: String, number: Int) throws {
        let text = "# broker settings\n[broker]\n\(line)\n"
        let error = try #require(
            #expect(throws: ConfigError.self) { try ConfigFile.parse(text, path: "/c/broker.toml") })
        #expect(error.description.contains("/c/broker.toml line \(number)"), "\(error)")
    }

    @Test func outsideTextIsRedactedFlattenedAndBounded() throws {
        let record = AccountRecord.sample("api", refreshToken: "rt-secret+/=value")
        let text = record.outsideText(alsoHiding: ["fresh-token"])
        let cleaned = try #require(
            text.clean("bad rt-secret+/=value and rt-secret%2B%2F%3Dvalue\n\u{1b}[31m fresh-token \u{202e}x"))
        #expect(cleaned == "bad [redacted] and [redacted] [31m [redacted] x")
        #expect(text.clean("a\u{1b}b\u{7}c\u{85}d\u{200b}e") == "abcde", "escape, bell, C1 and format characters go")
        #expect(text.clean(" \n\t ") == nil)
        let long = try #require(text.clean(String(repeating: "x", count: 5000)))
        #expect(long.count == OutsideText.limit + 1)
        // A secret split by a control character is redacted too.
        #expect(text.clean("rt-secret+/=\u{7}value") == "[redacted]")
        #expect(!(text.clean(String(repeating: "y", count: 290) + "rt-secret+/=value") ?? "").contains("rt-secret"))
    }

    /// A helper gets stdin, stdout and stderr and nothing else of the broker's, even descriptors
    /// that were opened without close-on-exec.
    @Test func anExecHelperInheritsNoOtherDescriptor() throws {
        let leaked = open("/dev/null", O_RDONLY)  // deliberately without O_CLOEXEC
        #expect(leaked > 2)
        defer { close(leaked) }
        let lister =
            "import os\nfds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
            + "print(' '.join(str(f) for f in fds if f > 2 and os.path.exists('/proc/self/fd/%d' % f)))"
        let output = ExecRunner.runBlocking(["/usr/bin/python3", "-c", lister], timeout: 10)
        #expect(output.ending == .exited(0))
        #expect(String(decoding: output.stdout, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) == "")
    }
}

/// Config text that made TOMLKit's parser abort the broker (found by fuzzing) is refused by the
/// TOML reader with its first wrong line; characters beyond ASCII in strings and comments are fine.
@Suite struct TOMLRefusalTests {
    @Test(arguments: [
        ("[é]\n", 1), ("[broker]\n# fine: é\nrefresh_floor = 60\n[accounts.é]\n", 4), ("a = \"x\"\n\u{0}", 2),
        // The stray `]` on line 1 is the first thing wrong (TOMLKit's precheck let it pass and stopped at line 2).
        ("a = 'é' ]\nb = ü\n", 1), ("s = \"\"\"\né\n\"\"\"\n[ö]\n", 4), ("s = \"\\\"é\" é\n", 1),
        ("[.a]\n", 1), ("x = 1\n  [=]\n", 2), ("[#]\n", 1), ("[[,a]]\n", 1), ("[ ~]\n", 1), ("[\n", 1),
        ("c = [\n  [1],\n]\n[.b]\n", 4), ("and = [}}\n", 1), ("a = [1,\n }\n", 2), ("a = { b = [ 1 } ]\n", 1),
    ])
    func forbiddenBytesOutsideStringsAndComments(text: String, line: Int) throws {
        let error = try #require(#expect(throws: ConfigError.self) { try ConfigFile.parse(text, path: "/c.toml") })
        #expect(error.description.contains("/c.toml line \(line)"), "\(error)")
    }

    @Test func unicodeInStringsAndCommentsIsFine() throws {
        let text = """
            # Grüße
            [accounts."straße"]
            kind = "sliding"
            endpoint = "https://idp.example/r" # ünïcode
            timezone = 'Europe/Berlin'
            scope = \"\"\"
            é ü
            \"\"\"
            command = [
              "/bin/x", [ "nested" ],
              { a = "é" },
            ]
            """
        let account = try #require(TOMLTable(parsing: text)["accounts"]?.table?["straße"]?.table)
        #expect(account["scope"] == .string("é ü\n"))
        #expect(account["command"]?.array?[2].table?["a"] == .string("é"))
    }
}
