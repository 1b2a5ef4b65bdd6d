import BrokerProtocol
import Foundation
import TestSupport
import Testing

/// `brokerctl kube-credential`, `docker-credential` and `header`, fed exactly what kubectl and
/// docker send, their answers compared field by field with the documented formats.
@Suite struct ToolCredentialTests {
    private func object(_ text: String) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any]
    }

    /// The expiry the broker gives for its current token, to the second.
    private func expiry(_ bridge: BridgeBroker) async throws -> Date? {
        let json = try await bridge.run(["token", "api", "--json"])
        return (object(json.stdout)?["expires_at"] as? String).flatMap(Wire.parseRFC3339)
    }

    @Test func kubectlExecCredentialsForV1AndV1beta1() async throws {
        let bridge = try await BridgeBroker.start { _ in "" }
        // What kubectl sets for an exec plugin with interactiveMode: Never (client-go's exec.go).
        let info: (String) -> String = { version in
            #"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/\#(version)","spec":{"interactive":false}}"#
        }
        for (environment, version) in [
            (["KUBERNETES_EXEC_INFO": info("v1")], "v1"), (["KUBERNETES_EXEC_INFO": info("v1beta1")], "v1beta1"),
            ([:], "v1"),
        ] {
            let result = try await bridge.run(["kube-credential", "api"], environment: environment)
            #expect(result.status == 0, "\(result.stderr)")
            let credential = try #require(object(result.stdout))
            #expect(Set(credential.keys) == ["kind", "apiVersion", "status"])
            #expect(credential["kind"] as? String == "ExecCredential")
            #expect(credential["apiVersion"] as? String == "client.authentication.k8s.io/\(version)")
            let status = try #require(credential["status"] as? [String: Any])
            #expect(Set(status.keys) == ["token", "expirationTimestamp"])
            #expect(status["token"] as? String == bridge.lastIssued)
            let timestamp = try #require(status["expirationTimestamp"] as? String)
            #expect(timestamp.hasSuffix("Z") && timestamp.count == 20, "RFC 3339 in UTC: \(timestamp)")
            let expected = try await expiry(bridge).map {
                Date(timeIntervalSince1970: $0.timeIntervalSince1970.rounded(.down))
            }
            #expect(Wire.parseRFC3339(timestamp) == expected)
        }
        #expect(bridge.idp.callCount == 1)

        // With provideClusterInfo: https and loopback http clusters get the token.
        let cluster: (String) -> String = { server in
            #"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"cluster":{"server":"\#(server)"},"interactive":false}}"#
        }
        for server in ["https://k8s.example:6443", "http://127.0.0.1:8080"] {
            let result = try await bridge.run(
                ["kube-credential", "api"], environment: ["KUBERNETES_EXEC_INFO": cluster(server)])
            #expect(result.status == 0 && result.stdout.contains(bridge.lastIssued ?? "-"), "\(result.stderr)")
        }

        // A version this plugin does not speak, a broken KUBERNETES_EXEC_INFO, an unknown
        // account, a plain-http cluster elsewhere: a message on stderr, nothing on stdout, a
        // non-zero exit.
        for (environment, account) in [
            (["KUBERNETES_EXEC_INFO": info("v1alpha1")], "api"), (["KUBERNETES_EXEC_INFO": "{not json"], "api"),
            ([:], "nobody"), (["KUBERNETES_EXEC_INFO": cluster("http://k8s.example:8080")], "api"),
        ] {
            let result = try await bridge.run(["kube-credential", account], environment: environment)
            #expect(result.status != 0 && result.stdout.isEmpty && !result.stderr.isEmpty)
        }

        let header = try await bridge.run(["header", "api"])
        #expect(header.status == 0)
        #expect(header.stdout == "Authorization: Bearer \(bridge.lastIssued ?? "-")\n")
        await bridge.stop()
        bridge.expectNoSecretInOutputs()
    }

    @Test func dockerCredentialHelperProtocol() async throws {
        let bridge = try await BridgeBroker.start(accessToken: "at-pushed") { _ in
            """
            [accounts.api.docker]
            registries = ["https://index.docker.io/v1/", "ghcr.io", "registry.example:5000", "localhost:5000"]
            allow_http = ["registry.example:5000"]
            username = "x-access-token"
            """
        }
        let bin = try bridge.helperDirectory(named: ["docker-credential-tokenbroker"])
        let helper = bin + "/docker-credential-tokenbroker"

        // erase of a served registry, as `docker logout ghcr.io` sends it (docker 28.2), while the
        // broker holds a pushed token it never refreshed: the first has it rejected (one
        // refresh), the three after it find the new token fresh and leave it alone (when a token
        // counts as fresh is `DockerBridge.erasesToken`'s, tested in BridgeSettingsTests).
        #expect(bridge.idp.callCount == 0)
        for spelling in ["ghcr.io", "ghcr.io", "http://ghcr.io", "https://ghcr.io"] {
            let erase = try await bridge.run(["erase"], program: helper, stdin: spelling)
            #expect(erase.status == 0 && erase.stdout.isEmpty, "\(erase.stdout)")
        }
        #expect(bridge.idp.callCount == 1)
        // docker writes the server URL without a newline; other callers add one, or a scheme.
        for (input, serverURL) in [
            ("https://index.docker.io/v1/", "https://index.docker.io/v1/"), ("ghcr.io", "ghcr.io"),
            ("https://ghcr.io\n", "https://ghcr.io"), ("registry.example:5000", "registry.example:5000"),
            ("GHCR.IO/", "GHCR.IO/"),
        ] {
            let get = try await bridge.run(["get"], program: helper, stdin: input)
            #expect(get.status == 0, "\(input): \(get.stdout)")
            let answer = try #require(object(get.stdout) as? [String: String])
            #expect(
                answer == ["ServerURL": serverURL, "Username": "x-access-token", "Secret": bridge.lastIssued ?? "-"])
        }
        #expect(bridge.idp.callCount == 1)

        for input in ["registry.other.example", "index.docker.io/v2/", "https://ghcr.io/org/repo", ""] {
            let missing = try await bridge.run(["get"], program: helper, stdin: input)
            #expect(missing.status == 1)
            #expect(
                missing.stdout
                    == (input.isEmpty ? "no server URL on stdin\n" : "credentials not found in native keychain\n"))
        }

        // An http:// URL gets the token only for a loopback registry or one listed in allow_http;
        // for another, docker hears "not found" and the user a warning on stderr.
        let plain = try await bridge.run(["get"], program: helper, stdin: "http://ghcr.io")
        #expect(plain.status == 1 && plain.stdout == "credentials not found in native keychain\n")
        #expect(plain.stderr.hasPrefix("brokerctl: ") && plain.stderr.contains("http://ghcr.io"))
        #expect(plain.stderr.filter { $0 == "\n" }.count == 1)
        for input in ["http://localhost:5000", "http://registry.example:5000"] {
            let served = try await bridge.run(["get"], program: helper, stdin: input)
            #expect(object(served.stdout)?["Secret"] as? String == bridge.lastIssued, "\(input): \(served.stderr)")
        }

        let list = try await bridge.run(["list"], program: helper)
        #expect(list.status == 0)
        #expect(
            object(list.stdout) as? [String: String] == [
                "index.docker.io/v1": "x-access-token", "ghcr.io": "x-access-token",
                "registry.example:5000": "x-access-token", "localhost:5000": "x-access-token",
            ])

        let store = try await bridge.run(
            ["store"], program: helper,
            stdin: #"{"ServerURL":"ghcr.io","Username":"someone","Secret":"a-password-docker-stores"}"#)
        #expect(store.status == 0 && store.stdout.isEmpty)
        #expect(
            try await bridge.run(["get"], program: helper, stdin: "ghcr.io").stdout.contains(bridge.lastIssued ?? "-"))

        let unknown = try await bridge.run(["erase"], program: helper, stdin: "registry.other.example")
        #expect(unknown.status == 1 && unknown.stdout == "credentials not found in native keychain\n")

        let version = try await bridge.run(["version"], program: helper)
        #expect(
            version.status == 0 && version.stdout.hasPrefix("docker-credential-tokenbroker ")
                && version.stdout.filter { $0 == "\n" }.count == 1)
        // The same helper under its brokerctl name.
        let direct = try await bridge.run(["docker-credential", "get"], stdin: "ghcr.io")
        #expect(object(direct.stdout)?["Secret"] as? String == bridge.lastIssued)

        await bridge.stop()
        let down = try await bridge.run(["get"], program: helper, stdin: "ghcr.io")
        #expect(down.status == 1 && down.stdout.hasPrefix("brokerctl:"))
        bridge.expectNoSecretInOutputs()
    }
}
