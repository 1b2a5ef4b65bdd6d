import BrokerProtocol
import Testing

/// The closed set of error codes of protocol/PROTOCOL.md section 10, mapped one to one.
@Suite struct ErrorCodeTests {
    @Test(arguments: [
        ("bad_request", BrokerError.Code.badRequest),
        ("line_too_long", .lineTooLong),
        ("unknown_op", .unknownOp),
        ("unsupported_version", .unsupportedVersion),
        ("not_found", .notFound),
        ("forbidden", .forbidden),
        ("needs_login", .needsLogin),
        ("unavailable", .unavailable),
        ("locked", .locked),
        ("busy", .busy),
        ("internal", .internal),
        ("lifetime_too_short", .lifetimeTooShort),
        ("damaged", .damaged),
    ])
    func everyContractCodeMapsFromAndToItsWireString(wire: String, code: BrokerError.Code) {
        #expect(BrokerError.Code(wire: wire) == code)
        #expect(code.rawValue == wire)
        #expect(code.description == wire)
    }

    @Test func allListsThirteenDistinctCodesThatEachRoundTrip() {
        #expect(BrokerError.Code.all.count == 13)
        #expect(Set(BrokerError.Code.all).count == 13)
        for code in BrokerError.Code.all {
            #expect(BrokerError.Code(wire: code.rawValue) == code)
        }
    }

    @Test(arguments: ["", "NEEDS_LOGIN", "needs-login", "needs_login ", "rate_limited", "ok", "null"])
    func unknownStringsBecomeInternal(wire: String) {
        #expect(BrokerError.Code(wire: wire) == .internal)
    }

    @Test func errorsAreEqualByCodeAndDescribeThemselves() {
        let a = BrokerError(.unavailable, "the IdP is down", retryAfterMs: 5000)
        let b = BrokerError(.unavailable, "something else")
        #expect(a == b)
        #expect(a != BrokerError(.needsLogin, "the IdP is down"))
        #expect(a.retryAfterMs == 5000)
        #expect(a.description == "unavailable: the IdP is down")
    }

    @Test func errorBodyMapsBackToTheTypedError() {
        let body = ErrorBody(code: "busy", message: "shedding load", retryAfterMs: 250)
        #expect(body.brokerError.code == .busy)
        #expect(body.brokerError.message == "shedding load")
        #expect(body.brokerError.retryAfterMs == 250)
        #expect(ErrorBody(code: "from_the_future", message: "x").brokerError.code == .internal)
    }
}
