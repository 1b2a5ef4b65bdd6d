import Foundation
import TestSupport
import Testing

/// Every error a user meets through brokerctl (docs/commands.md, "Common options and exit codes")
/// says what happened and what to do in brokerctl's terms: a command, an option, a broker.toml key
/// or an environment variable, never a Swift type or value. So does every line of brokerd's log.
@Suite struct ErrorMessageTests {
    /// What a message must name: one of these.
    static let remedies = [
        "brokerctl ", "--", "broker.toml", "XDG_RUNTIME_DIR", "TOKENBROKER_SOCKET", "token_endpoint", "issuer",
    ]

    /// Swift showing through: a type or enum case followed by its payload (`credentialWouldMove(`),
    /// or names only Swift's libraries use.
    static func swiftValues(in text: String) -> [String] {
        let payload = #/[A-Za-z_][A-Za-z0-9_]*\(/#
        var found = text.matches(of: payload).map { String(text[$0.range]) }
        for name in ["IOError", "NIO", "Error(", "Optional(", "BrokerFailure", "HTTPClientError"]
        where text.contains(name) {
            found.append(name)
        }
        return found
    }

    /// Checks one brokerctl failure: a nonzero exit and a message naming a remedy, with no Swift value.
    static func expectHelpful(
        _ result: (status: Int32, stdout: String, stderr: String), _ what: String, naming: [String] = [],
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        // docker-credential answers docker on stdout, errors included.
        let message = result.stderr + result.stdout
        #expect(result.status != 0, "\(what): exit 0", sourceLocation: sourceLocation)
        #expect(
            remedies.contains { message.contains($0) }, "\(what): names no remedy: \(message)",
            sourceLocation: sourceLocation)
        #expect(swiftValues(in: message).isEmpty, "\(what): a Swift value: \(message)", sourceLocation: sourceLocation)
        for needle in naming {
            #expect(message.contains(needle), "\(what): \(needle) missing: \(message)", sourceLocation: sourceLocation)
        }
    }

    @Test func everyErrorPathSaysWhatToDo() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-errors", lifetime: 3600)
        let deadPort = try freePort()
        let broker = try BrokerProcess()
        let oauth2 = { (endpoint: String, client: String) in
            "kind = \"oauth2\"\ntoken_endpoint = \"\(endpoint)\"\nclient_id = \"\(client)\""
        }
        let config = """
            [accounts.fresh]
            \(oauth2(idp.tokenEndpoint, idp.clientID))

            [accounts.fresh.docker]
            registries = ["registry.example"]

            [accounts.fresh.git]
            hosts = ["git.example"]

            [accounts.down]
            \(oauth2("http://127.0.0.1:\(deadPort)/token", idp.clientID))

            [accounts.stranger]
            \(oauth2(idp.tokenEndpoint, "not-\(idp.clientID)"))

            [accounts.pushed]
            kind = "static"
            """
        try broker.writeConfig(config)
        try await broker.start()
        defer { broker.stop() }
        for account in ["down", "stranger"] {
            let pushed = try await broker.brokerctl(["set-tokens", account], stdin: #"{"refresh_token":"rt-errors"}"#)
            #expect(pushed.status == 0, "\(pushed.stderr)")
        }
        let static600 = #"{"access_token":"tok-static","expires_in":600}"#
        #expect(try await broker.brokerctl(["set-tokens", "pushed"], stdin: static600).status == 0)

        // token
        Self.expectHelpful(
            try await broker.brokerctl(["token", "fresh"]), "token of an account never given a refresh token",
            naming: ["no refresh token", "brokerctl set-tokens fresh", "brokerctl update fresh"])
        let unreachable = try await broker.brokerctl(["token", "down"])
        Self.expectHelpful(
            unreachable, "token at an unreachable IdP", naming: ["127.0.0.1:\(deadPort)", "connection refused"])
        #expect(!unreachable.stderr.contains("denied"))
        let stranger = try await broker.brokerctl(["token", "stranger"])
        Self.expectHelpful(
            stranger, "token of a client the IdP refuses",
            naming: ["invalid_client", "brokerctl update stranger --secrets -", "client_auth", "broker.toml"])
        #expect(!stranger.stderr.contains("sign in again"))
        Self.expectHelpful(
            try await broker.brokerctl(["token", "nobody"]), "token of no account", naming: ["brokerctl status"])
        Self.expectHelpful(
            try await broker.brokerctl(["token", "pushed", "--min-ttl", "3600"]), "token longer than a pushed one",
            naming: ["brokerctl set-tokens pushed"])

        // login
        Self.expectHelpful(
            try await broker.brokerctl(["login", "fresh", "--client-id", "other", "--flow", "device"]),
            "login of an existing account with other options", naming: ["brokerctl login fresh", "broker.toml"])
        Self.expectHelpful(
            try await broker.brokerctl(["login", "newcomer", "--flow", "device"]),
            "login of no account without a provider",
            naming: ["--issuer"])
        Self.expectHelpful(
            try await broker.brokerctl(["login", "newcomer", "--client-id", "x", "--flow", "device"]),
            "login without an endpoint")
        Self.expectHelpful(
            try await broker.brokerctl([
                "login", "newcomer", "--issuer", "http://127.0.0.1:\(deadPort)", "--client-id", "x", "--flow", "device",
            ]), "login at an unreachable IdP", naming: ["127.0.0.1:\(deadPort)", "connection refused", "--issuer"])
        Self.expectHelpful(
            try await broker.brokerctl([
                "login", "newcomer", "--token-endpoint", idp.tokenEndpoint, "--device-authorization-endpoint",
                idp.deviceAuthorizationEndpoint, "--client-id", "not-\(idp.clientID)", "--flow", "device",
            ]), "login with a client the IdP refuses", naming: ["invalid_client", "--client-id", "--client-auth"])

        // add
        Self.expectHelpful(
            try await broker.brokerctl(["add", "pushed", "--kind", "static", "--secrets", "-"], stdin: static600),
            "add of an existing account", naming: ["brokerctl remove pushed", "brokerctl set-tokens pushed"])
        Self.expectHelpful(
            try await broker.brokerctl(["add", "newcomer", "--kind", "oauth2", "--client-id", "x"]),
            "add without an endpoint")

        // set-tokens
        Self.expectHelpful(
            try await broker.brokerctl(["set-tokens", "nobody"], stdin: static600), "set-tokens of no account",
            naming: ["brokerctl status"])
        Self.expectHelpful(
            try await broker.brokerctl(["set-tokens", "pushed"], stdin: "{}"), "set-tokens of nothing",
            naming: ["brokerctl set-tokens"])
        Self.expectHelpful(
            try await broker.brokerctl(["refresh", "pushed"]), "refresh of a pushed-only account",
            naming: ["brokerctl set-tokens pushed"])

        // reload
        try broker.writeConfig("[accounts.fresh\nkind = ")
        Self.expectHelpful(
            try await broker.brokerctl(["reload"]), "reload of a broken file",
            naming: ["broker.toml", "brokerctl reload"])
        try broker.writeConfig(config.replacing(#"client_id = "not-"#, with: #"client_id = "moved-"#))
        let moved = try await broker.brokerctl(["reload"])
        Self.expectHelpful(moved, "reload moving a credential", naming: ["brokerctl logout stranger"])

        // The bridges
        Self.expectHelpful(
            try await broker.brokerctl(["kube-credential", "fresh"]), "kube-credential of an account without tokens",
            naming: ["brokerctl set-tokens fresh"])
        Self.expectHelpful(
            try await broker.brokerctl(["header", "fresh"]), "header of an account without tokens",
            naming: ["brokerctl set-tokens fresh"])
        Self.expectHelpful(
            try await broker.brokerctl(["git-credential", "get"], stdin: "protocol=https\nhost=git.example\n\n"),
            "git-credential of an account without tokens", naming: ["brokerctl set-tokens fresh"])
        let docker = try await broker.brokerctl(["docker-credential", "get"], stdin: "registry.example")
        Self.expectHelpful(
            docker, "docker-credential of an account without tokens", naming: ["brokerctl set-tokens fresh"])

        // No broker where XDG_RUNTIME_DIR would have put it.
        var environment = broker.environment
        environment["XDG_RUNTIME_DIR"] = nil
        let missing = try await ChildProcess.capture(
            BrokerProcess.binary("brokerctl").path, ["token", "fresh"], environment: environment, stdin: nil)
        Self.expectHelpful(
            missing, "no runtime directory", naming: ["XDG_RUNTIME_DIR", "TOKENBROKER_SOCKET", "--socket"])

        #expect(Self.swiftValues(in: broker.log).isEmpty, "brokerd's log: \(Self.swiftValues(in: broker.log))")
        #expect(broker.log.contains("connection refused"))
        #expect(!broker.log.contains(idp.clientSecret) && !broker.log.contains("rt-errors"))
        await idp.shutdown()
    }
}
