@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing

/// The normal form of a proof's `htu` (RFC 3986 section 6.2.2, docs/dpop.md, "Which URLs get a
/// proof") and the looser comparison of an IdP's endpoints (`DPoPDoor`).
@Suite struct NormalizedURLTests {
    /// Spellings of `https://idp.example/token` and their normal form.
    static let spellings: [(String, String)] = [
        ("https://idp.example/token", "https://idp.example/token"),
        ("HTTPS://IDP.Example/token", "https://idp.example/token"),
        ("https://idp.example:443/token", "https://idp.example/token"),
        ("https://idp.example:/token", "https://idp.example/token"),
        ("https://idp.example/%74oken", "https://idp.example/token"),
        ("https://idp.example/%74%6F%6b%65%6E", "https://idp.example/token"),
        ("https://idp.example/./token", "https://idp.example/token"),
        ("https://idp.example/x/../token", "https://idp.example/token"),
        ("https://idp.example/x/%2E%2e/token", "https://idp.example/token"),
        ("https://idp.example/../../token", "https://idp.example/token"),
        ("https://idp.example/token?grant_type=x#f", "https://idp.example/token"),
    ]

    @Test(arguments: spellings)
    func eachSpellingHasTheOneNormalForm(text: String, normal: String) throws {
        #expect(try #require(NormalizedURL(text)).description == normal)
    }

    @Test func escapesAreUppercaseAndAnEmptyPathIsTheRoot() throws {
        #expect(NormalizedURL("https://a.example")?.description == "https://a.example/")
        #expect(NormalizedURL("https://a.example?q")?.description == "https://a.example/")
        #expect(NormalizedURL("http://127.0.0.1:80/a%2fb%c3%a9")?.description == "http://127.0.0.1/a%2Fb%C3%A9")
        #expect(NormalizedURL("https://a.example/a\\b\"c")?.description == "https://a.example/a%5Cb%22c")
        #expect(NormalizedURL("https://a.example/a/b/..")?.description == "https://a.example/a/")
        #expect(NormalizedURL("https://a.example/a/./")?.description == "https://a.example/a/")
        #expect(NormalizedURL("https://[::1]:8443/x")?.description == "https://[::1]:8443/x")
        #expect(NormalizedURL("https://a.example/%7euser:@x")?.description == "https://a.example/~user:@x")
    }

    /// What must stay apart from `https://idp.example/token`, in normal form and as doors.
    static let others = [
        "https://idp.example/token2", "https://idp.example/tokens/x", "https://idp.example:8443/token",
        "http://idp.example/token", "https://idp2.example/token", "https://idp.example/Token",
        "https://idp.example/x/token",
    ]

    @Test(arguments: others)
    func otherURLsStayDistinct(text: String) throws {
        let token = try #require(NormalizedURL("https://idp.example/token"))
        let other = try #require(NormalizedURL(text))
        #expect(other != token)
        #expect(DPoPDoor(other) != DPoPDoor(token))
    }

    @Test(arguments: [
        "ftp://a.example/", "https://", "https://a.example:0/", "https://a.example:65536/",
        "https://u@a.example/", "https://a%2Eexample/", "https://a.example/%zz", "https://a.example/%4", "/token",
        "https://a.example:44x/", "https://[::1/", "https:/a.example/",
    ])
    func aURLWithoutANormalFormIsNil(text: String) {
        #expect(NormalizedURL(text) == nil)
    }

    /// Doors compare what a server may read as one request: repeated and trailing slashes,
    /// every escape decoded, and every loopback spelling one host.
    @Test func doorsFoldWhatAServerMayReadAsOneRequest() throws {
        func door(_ text: String) throws -> DPoPDoor { DPoPDoor(try #require(NormalizedURL(text))) }
        let token = try door("http://127.0.0.1:8080/token")
        for text in [
            "http://127.0.0.1:8080//token", "http://127.0.0.1:8080/token/", "http://127.0.0.1:8080///token//",
            "http://localhost:8080/token", "http://LOCALHOST.:8080/token", "http://[::1]:8080/token",
            "http://[0:0:0:0:0:0:0:1]:8080/token", "http://127.1:8080/token", "http://127.0.0.2:8080/token",
            "http://2130706433:8080/token", "http://0x7f.0.0.1:8080/token", "http://[::ffff:127.0.0.1]:8080/token",
            "http://a.localhost:8080/token", "http://127.0.0.1:8080/%74oken",
        ] {
            #expect(try door(text) == token, "\(text)")
        }
        #expect(try door("https://idp.example./token") == door("https://IDP.example/token"))
        #expect(try door("https://idp.example/a%20b") == door("https://idp.example/a b"))
        #expect(try door("http://127.0.0.1:8081/token") != token)
        #expect(try door("http://10.0.0.1:8080/token") != token)
        #expect(try door("https://127.0.0.1:8080/token") == token, "the scheme does not tell a port apart")
    }
}
