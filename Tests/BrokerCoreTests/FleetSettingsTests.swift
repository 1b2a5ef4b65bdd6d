@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// broker.toml's `[fleet]`: the database URL checked whole (never a password), TLS unless the
/// server is on this host or `tls = "disable"`, a lease that outlasts three IdP timeouts.
@Suite struct FleetSettingsTests {
    static func parse(_ fleet: String, broker: String = "") throws -> FleetSettings? {
        try ConfigFile.parse("[broker]\n\(broker)\n[fleet]\n\(fleet)\n", path: "/cfg/broker.toml").fleet
    }

    static func refusal(_ fleet: String, broker: String = "") -> String {
        do {
            _ = try parse(fleet, broker: broker)
            return "accepted"
        } catch {
            return "\(error)"
        }
    }

    @Test func aLoopbackDatabaseIsPlainAndAnyOtherUsesTLS() throws {
        let local = try #require(try Self.parse(#"database = "postgresql://tb@127.0.0.1:5433/fleet""#))
        #expect(local.databaseHost == "127.0.0.1" && local.databasePort == 5433 && local.databaseUser == "tb")
        #expect(local.databaseName == "fleet" && local.transport == .plain && local.leaseSeconds == 90)
        #expect(!local.host.isEmpty, "the host name by default")
        // 3 times the default request_timeout (30 s) is more than 60 s.

        let remote = try #require(
            try Self.parse(
                """
                database = "postgres://tb@db.example/fleet"
                ca_file = "/etc/tokenbroker/db-ca.pem"
                host = "runner-07"
                lease_seconds = 120
                """))
        #expect(remote.databasePort == 5432 && remote.transport == .tls(caFile: "/etc/tokenbroker/db-ca.pem"))
        #expect(remote.host == "runner-07" && remote.leaseSeconds == 120)
        #expect(try Self.parse(#"database = "postgresql://tb@db.example/fleet""#)?.transport == .tls(caFile: nil))
        let disabled = try Self.parse(
            """
            database = "postgresql://tb@[fd00::5]:5432/fleet"
            tls = "disable"
            """)
        #expect(disabled?.databaseHost == "fd00::5" && disabled?.transport == .plain)
        #expect(try ConfigFile.parse("", path: "/cfg/broker.toml").fleet == nil, "no [fleet]: every account is local")
    }

    @Test func aPasswordInTheURLIsRefusedAndNotRepeated() {
        for url in ["postgresql://tb:s3cret-pw@db.example/fleet", "postgresql://tb:@db.example/fleet"] {
            let refusal = Self.refusal("database = \"\(url)\"")
            #expect(refusal.contains("holds a password"), "\(refusal)")
            #expect(!refusal.contains("s3cret-pw"))
        }
    }

    @Test(arguments: [
        (#"database = "https://tb@db.example/fleet""#, "postgresql://"),
        (#"database = "postgresql://db.example/fleet""#, "database user"),
        (#"database = "postgresql://tb@db.example""#, "one database"),
        (#"database = "postgresql://tb@db.example/fleet?sslmode=disable""#, "one database"),
        (#"database = "postgresql://tb@db.example:70000/fleet""#, "out of range"),
        ("database = 5", "is required"),
        ("password_file = \"/x\"", "is required"),
        ("database = \"postgresql://tb@db.example/fleet\"\nca_file = \"relative.pem\"", "absolute path"),
        ("database = \"postgresql://tb@db.example/fleet\"\ntls = \"require\"", "only be \"disable\""),
        ("database = \"postgresql://tb@db.example/fleet\"\ntls = \"disable\"\nca_file = \"/ca.pem\"", "choose one"),
        ("database = \"postgresql://tb@db.example/fleet\"\nhost = \"a b\"", "fleet.host"),
        ("database = \"postgresql://tb@db.example/fleet\"\nlease_seconds = 1e400", "lease_seconds"),
        ("database = \"postgresql://tb@db.example/fleet\"\nlease = 60", "unknown key fleet.lease"),
    ])
    func aBrokenFleetTableIsRefusedWithWhatToDo(fleet: String, says: String) {
        let refusal = Self.refusal(fleet)
        #expect(refusal.contains(says), "\(refusal)")
    }

    @Test func theLeaseMustOutlastThreeIdPTimeouts() throws {
        let url = #"database = "postgresql://tb@127.0.0.1/fleet""#
        let refusal = Self.refusal(url + "\nlease_seconds = 80", broker: "request_timeout = 30")
        #expect(refusal.contains("at least 3 times broker.request_timeout"), "\(refusal)")
        #expect(try Self.parse(url + "\nlease_seconds = 90", broker: "request_timeout = 30")?.leaseSeconds == 90)
        #expect(try Self.parse(url, broker: "request_timeout = 40")?.leaseSeconds == 120, "the default grows with it")
    }

    @Test func theFleetsSecretsComeFromPrivateFilesAndAPasswordIsOneShortLine() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var settings = try #require(try Self.parse(#"database = "postgresql://tb@127.0.0.1/fleet""#))
        let none = #expect(throws: FleetError.self) { try FleetCredentials(settings: settings, environment: [:]) }
        #expect(none?.description.contains("no fleet key") == true)

        try FleetKey.create(at: directory.file("fleet-key"))
        #expect(throws: FleetError.self) { try FleetKey.create(at: directory.file("fleet-key")) }
        let password = directory.file("fleet-db-password")
        _ = FileManager.default.createFile(
            atPath: password, contents: Data("pw-line\nignored\n".utf8), attributes: [.posixPermissions: 0o600])
        let credentials = try FleetCredentials(
            settings: settings, environment: ["CREDENTIALS_DIRECTORY": directory.path])
        #expect(credentials.password == "pw-line", "the systemd credentials' names, the first line")

        settings.passwordFile = password
        settings.keyFile = directory.file("fleet-key")
        _ = FileManager.default.createFile(
            atPath: password, contents: Data(repeating: 0x61, count: 5000), attributes: [.posixPermissions: 0o600])
        let long = #expect(throws: FleetError.self) { try FleetCredentials(settings: settings, environment: [:]) }
        #expect(long?.description.contains("one line") == true)
        chmod(password, 0o644)
        #expect(throws: (any Error).self) { try FleetCredentials(settings: settings, environment: [:]) }
    }
}
