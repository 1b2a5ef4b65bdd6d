import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

/// The real brokerd against hostile numbers on its socket and a helper looking for its
/// descriptors (docs/security.md, "What brokerd does not trust").
@Suite struct HostileInputTests {
    @Test func outOfRangeMinTTLIsABadRequestAndTheBrokerStaysUp() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        _ = try await client.add(
            account: "steady", provider: ProviderSpec(kind: "static"),
            tokens: TokenSet(accessToken: "steady-token", expiresIn: 3600))
        let raw = try RawConnection(path: broker.socketPath)
        for minTTL in ["1e300", "1.7976931348623157e308", "-1", "315360001", "1e17"] {
            raw.send(#"{"id":9,"op":"token","account":"steady","min_ttl":\#(minTTL)}"# + "\n")
            let answer = try #require(raw.readObject(), "no answer for min_ttl \(minTTL)")
            #expect(answer.errorCode == "bad_request", "min_ttl \(minTTL)")
        }
        raw.send(
            #"{"id":10,"op":"set_tokens","account":"steady","tokens":{"access_token":"t","expires_in":-1e300}}"# + "\n")
        #expect(raw.readObject()?["ok"] as? Bool == true, "a negative lifetime is an expired token")
        raw.send(
            #"{"id":11,"op":"set_tokens","account":"steady","tokens":{"access_token":"long","expires_in":1e300}}"#
                + "\n")
        #expect(raw.readObject()?["ok"] as? Bool == true)
        #expect(try await client.token(account: "steady", minTTL: 1e8).accessToken == "long")
        #expect(try await client.status(account: "steady").first?.state == "valid")
    }

    /// A config that made the TOML parser abort (a fuzz finding) is refused at reload by line;
    /// the broker keeps serving.
    @Test func aConfigTheParserCannotTakeIsRefusedAtReload() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        try broker.writeConfig("[broker]\nrefresh_floor = 60\n[é]\n")
        let error = await #expect(throws: BrokerError.self) { try await client.reload() }
        #expect(error?.message.contains("line 3") == true)
        #expect(try await client.hello().protocol == protocolVersion)
    }

    /// An exec helper of the running daemon sees only stdin, stdout and stderr: not the
    /// listening socket, client connections or event-loop descriptors.
    @Test func anExecHelperOfTheDaemonHoldsNoBrokerDescriptor() async throws {
        let broker = try BrokerProcess()
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        let lister =
            "import os, json\nfds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
            + "extra = [f for f in fds if f > 2 and os.path.exists('/proc/self/fd/%d' % f)]\n"
            + "print(json.dumps({'access_token': 'fds:' + ','.join(map(str, extra)), 'expires_in': 1}))"
        var spec = ProviderSpec(kind: "exec")
        spec["command"] = ["/usr/bin/python3", "-c", .string(lister)]
        _ = try await client.add(account: "fds", provider: spec)
        let token = try await client.token(account: "fds", minTTL: 0)
        #expect(token.accessToken == "fds:")
    }
}
