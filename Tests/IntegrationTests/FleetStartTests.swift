import BrokerClient
import BrokerProtocol
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// brokerd joining a fleet at start, against a real PostgreSQL server: `brokerctl fleet init`
/// makes the key, the first broker makes the schema before it answers `hello`, and a broker
/// holding another fleet's key, or a URL holding a password, stops it from starting.
@Suite(.serialized, .enabled(if: PostgresServer.isInstalled, "needs Debian's postgresql (scripts/install-deps)"))
struct FleetStartTests {
    /// A broker whose broker.toml names `server` with `key` as its fleet key.
    static func broker(
        on server: PostgresServer, key: String, host: String, database: String? = nil, broker settings: String = "",
        fleet extra: String = ""
    ) throws -> BrokerProcess {
        let broker = try BrokerProcess()
        let passwordFile = broker.configDirectory.appendingPathComponent("db-password").path
        try FileManager.default.createDirectory(at: broker.configDirectory, withIntermediateDirectories: true)
        try Data((server.password + "\n").utf8).write(to: URL(fileURLWithPath: passwordFile))
        chmod(passwordFile, 0o600)
        let url = database ?? "postgresql://\(server.username)@127.0.0.1:\(server.port)/\(server.database)"
        try broker.writeConfig(
            """
            [broker]
            \(settings)
            [fleet]
            database = "\(url)"
            password_file = "\(passwordFile)"
            key_file = "\(key)"
            host = "\(host)"
            \(extra)
            """)
        return broker
    }

    static func fleetInit(_ path: String) throws -> (status: Int32, stdout: String, stderr: String) {
        try ChildProcess.capture(
            BrokerProcess.binary("brokerctl").path, ["fleet", "init", "--key-file", path],
            environment: ["PATH": "/usr/bin:/bin"])
    }

    @Test func fleetInitWritesAPrivateKeyOnceAndNeedsNoBroker() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("fleet.key")
        let made = try Self.fleetInit(path)
        #expect(made.status == 0, "\(made.stderr)")
        #expect(made.stdout.contains("LoadCredentialEncrypted=fleet-key"))
        var info = stat()
        #expect(lstat(path, &info) == 0 && info.st_mode & 0o777 == 0o600 && info.st_size == 32)
        let key = try #require(FileManager.default.contents(atPath: path))

        let again = try Self.fleetInit(path)
        #expect(again.status != 0)
        #expect(again.stderr.contains("never overwritten"))
        #expect(FileManager.default.contents(atPath: path) == key, "the key was left as it was")
    }

    @Test func theFirstBrokerMakesTheSchemaAndAnotherFleetsKeyCannotStart() async throws {
        let server = try await PostgresServer.start()
        defer { server.stop() }
        let keys = try TemporaryDirectory()
        defer { keys.remove() }
        #expect(try Self.fleetInit(keys.file("fleet.key")).status == 0)
        #expect(try Self.fleetInit(keys.file("other.key")).status == 0)

        let first = try Self.broker(on: server, key: keys.file("fleet.key"), host: "runner-07")
        try await first.start()
        defer { first.stop() }
        let client = try first.client()
        #expect(try await client.hello().protocol == 1)
        client.close()
        let dump = try await server.dump()
        #expect(dump.contains("CREATE TABLE public.tokenbroker_accounts"), "the schema exists once hello answers")
        #expect(dump.contains("runner-07"), "the host is noted")
        #expect(first.log.contains("joined the fleet"))

        // The same key on another broker (another host) joins too.
        let second = try Self.broker(on: server, key: keys.file("fleet.key"), host: "runner-08")
        try await second.start()
        #expect(second.stop() == 0)

        let before = try await server.dump()
        let stranger = try Self.broker(on: server, key: keys.file("other.key"), host: "intruder")
        #expect(try await stranger.runExpectingExit() != 0)
        #expect(stranger.log.contains("does not open this database's canary"))
        #expect(try await server.dump() == before, "the stranger wrote nothing")
    }

    /// TLS to a database on another host, its certificate named by the IP address: a broker
    /// given the CA that signed it (`ca_file`) joins the fleet; one given another CA does not,
    /// and says why. The server takes TLS connections only on that address.
    @Test(.enabled(if: NetworkNamespaces.isAvailable, "needs root and iproute2"))
    func tlsToTheDatabaseVerifiesItsCertificateByIPAddress() async throws {
        let network = try await NetworkNamespaces.make(hosts: 1)
        defer { network.remove() }
        let server = try await PostgresServer.start(listenAddress: network.bridgeAddress)
        defer { server.stop() }
        let files = try TemporaryDirectory()
        defer { files.remove() }
        try Self.makeCertificates(in: files, for: network.bridgeAddress)
        try await server.requireTLS(certificate: files.file("server.crt"), key: files.file("server.key"))
        #expect(try Self.fleetInit(files.file("fleet.key")).status == 0)

        let database = "postgresql://\(server.username)@\(network.bridgeAddress):\(server.port)/\(server.database)"
        for (authority, trusted) in [("ca.crt", true), ("other-ca.crt", false)] {
            let broker = try Self.broker(
                on: server, key: files.file("fleet.key"), host: "tls", database: database,
                fleet: "ca_file = \"\(files.file(authority))\"")
            try await broker.start()
            defer { broker.stop() }
            #expect(broker.log.contains("joined the fleet") == trusted, "\(authority)")
            if trusted {
                let report = try await broker.brokerctl(["fleet", "status", "--json"])
                let status = try JSONDecoder().decode(FleetStatusResult.self, from: Data(report.stdout.utf8))
                #expect(status.reachable && status.schema == 2, "\(report.stdout)")
            } else {
                #expect(broker.log.contains("CERTIFICATE_VERIFY_FAILED"), "the TLS handshake refused the server")
            }
        }
    }

    /// A CA, a server certificate it signs for `address` (subjectAltName IP), and another CA,
    /// made with openssl in `directory`.
    static func makeCertificates(in directory: TemporaryDirectory, for address: String) throws {
        try Data("subjectAltName=IP:\(address)\n".utf8).write(to: URL(fileURLWithPath: directory.file("san.ext")))
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        let steps: [[String]] = [
            ["req", "-x509"] + key + ["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=test CA"],
            ["req", "-x509"] + key + [
                "-keyout", "other-ca.key", "-out", "other-ca.crt", "-days", "2", "-subj", "/CN=test CA",
            ],
            ["req"] + key + ["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=database"],
            [
                "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "server.crt", "-days", "2", "-extfile", "san.ext",
            ],
        ]
        for step in steps {
            let arguments = step.map {
                [
                    "ca.key", "ca.crt", "other-ca.key", "other-ca.crt", "server.key", "server.csr", "server.crt",
                    "san.ext",
                ].contains($0) ? directory.file($0) : $0
            }
            let made = try ChildProcess.run("/usr/bin/openssl", arguments, environment: ["PATH": "/usr/bin:/bin"])
            guard made.status == 0 else { throw HarnessError("openssl \(step[0]) failed: \(made.output)") }
        }
    }

    @Test func aDatabaseURLWithAPasswordIsRefusedWithoutShowingIt() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let key = directory.file("fleet.key")
        #expect(try Self.fleetInit(key).status == 0)
        let broker = try BrokerProcess()
        try broker.writeConfig(
            """
            [fleet]
            database = "postgresql://tokenbroker:hunter2-secret@127.0.0.1:5432/tokenbroker"
            key_file = "\(key)"
            """)
        #expect(try await broker.runExpectingExit() != 0)
        #expect(broker.log.contains("holds a password"))
        #expect(!broker.log.contains("hunter2-secret"))
    }
}
