import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// broker.toml's `[fleet]`: the PostgreSQL database a fleet's brokers share (docs/fleet.md).
/// Checked whole when read: no password in the URL, TLS unless the server is on this host or
/// `tls = "disable"` is set, a lease long enough for an IdP call.
public struct FleetSettings: Sendable, Equatable {
    /// How connections to the database are protected.
    public enum Transport: Sendable, Equatable {
        /// TLS, the server's certificate verified against `caFile` (or the system's roots when
        /// `nil`) and its name (or IP address) against the URL's host.
        case tls(caFile: String?)
        /// Plain TCP: on a loopback address, or where `tls = "disable"` says so.
        case plain
    }

    public var databaseHost: String
    public var databasePort: Int
    public var databaseUser: String
    public var databaseName: String
    public var transport: Transport
    /// Where the database password is; `nil`: `$CREDENTIALS_DIRECTORY/fleet-db-password` if
    /// there is one, else no password.
    public var passwordFile: String?
    /// Where the fleet key is; `nil`: `$CREDENTIALS_DIRECTORY/fleet-key`.
    public var keyFile: String?
    /// This broker's name in the fleet's rows; the host name by default.
    public var host: String
    /// How long a lease runs, in seconds.
    public var leaseSeconds: Double

    /// The keys of `[fleet]`.
    package static let keys = ["database", "password_file", "ca_file", "key_file", "host", "lease_seconds", "tls"]
    package static let defaultLeaseSeconds = 60.0
    /// A lease must outlast this many IdP timeouts (`[broker] request_timeout`).
    public static let leaseTimeouts = 3.0

    /// Reads `[fleet]` from `table` (`value`), with the engine's `settings` for the lease's floor.
    package static func parse(_ value: TOMLValue?, settings: BrokerSettings, path: String) throws -> FleetSettings? {
        guard let value else { return nil }
        let place = "\(path): fleet"
        guard let table = value.table else { throw ConfigError(description: "\(place) must be a table") }
        for key in table.keys where !keys.contains(key) {
            throw ConfigError(description: "\(path): unknown key fleet.\(key) (known: \(keys.joined(separator: ", ")))")
        }
        guard let database = table["database"]?.string else {
            throw ConfigError(
                description: "\(place).database is required: postgresql://USER@HOST:PORT/DATABASE (no password)")
        }
        var settings = try parseDatabase(database, place: "\(place).database", requestTimeout: settings.requestTimeout)
        let files = try ["password_file", "ca_file", "key_file"].map { try file(table[$0], place: "\(place).\($0)") }
        settings.passwordFile = files[0]
        settings.keyFile = files[2]
        switch table["tls"].map({ $0.string }) {
        case nil:
            settings.transport = files[1] != nil || !isLoopback(settings.databaseHost) ? .tls(caFile: files[1]) : .plain
        case "disable"?:
            guard files[1] == nil else {
                throw ConfigError(description: "\(place).tls = \"disable\" beside fleet.ca_file: choose one")
            }
            settings.transport = .plain
        default:
            throw ConfigError(description: "\(place).tls may only be \"disable\" (TLS is used unless it says so)")
        }
        if let host = table["host"] {
            guard let name = host.string, isHostName(name) else {
                throw ConfigError(
                    description: "\(place).host must be 1 to 64 letters, digits, '.', '-' or '_' (a name for this host)"
                )
            }
            settings.host = name
        }
        if let lease = table["lease_seconds"] {
            guard let seconds = lease.double ?? lease.int.map(Double.init), seconds.isFinite, seconds <= 86_400 else {
                throw ConfigError(description: "\(place).lease_seconds must be a number of seconds up to 86400")
            }
            settings.leaseSeconds = seconds
        }
        return settings
    }

    /// The parts of `postgresql://USER@HOST[:PORT]/DATABASE`, checked; its lease the default.
    private static func parseDatabase(_ text: String, place: String, requestTimeout: Double) throws
        -> FleetSettings
    {
        let form = "postgresql://USER@HOST:PORT/DATABASE"
        guard text.utf8.count <= 1024, !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }),
            let components = URLComponents(string: text)
        else { throw ConfigError(description: "\(place) is not a URL of the form \(form)") }
        guard components.scheme == "postgresql" || components.scheme == "postgres" else {
            throw ConfigError(description: "\(place) must start with postgresql:// (\(form))")
        }
        guard components.password == nil, !text.contains(":@") else {
            throw ConfigError(
                description:
                    "\(place) holds a password: refused (a URL is logged and shown); put it in fleet.password_file")
        }
        guard let user = components.user, !user.isEmpty, isHostName(user) else {
            throw ConfigError(description: "\(place) must name the database user (\(form))")
        }
        guard let host = components.host, !host.isEmpty else {
            throw ConfigError(description: "\(place) must name the database's host (\(form))")
        }
        let port = components.port ?? 5432
        guard (1...65535).contains(port) else {
            throw ConfigError(description: "\(place): port \(port) is out of range")
        }
        let name = String(components.path.dropFirst())
        guard components.path.hasPrefix("/"), !name.isEmpty, isHostName(name), components.query == nil,
            components.fragment == nil
        else { throw ConfigError(description: "\(place) must name one database and nothing after it (\(form))") }
        return FleetSettings(
            databaseHost: host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host, databasePort: port,
            databaseUser: user, databaseName: name, transport: .plain, passwordFile: nil, keyFile: nil,
            host: localHostName(),
            leaseSeconds: max(defaultLeaseSeconds, leaseTimeouts * requestTimeout))
    }

    /// Checks the lease against the engine's IdP timeout (after `[broker]` was read).
    package func checkLease(settings: BrokerSettings, path: String) throws {
        guard leaseSeconds >= Self.leaseTimeouts * settings.requestTimeout else {
            throw ConfigError(
                description:
                    "\(path): fleet.lease_seconds (\(leaseSeconds)) must be at least 3 times broker.request_timeout "
                    + "(\(settings.requestTimeout)): a lease must outlast an IdP call")
        }
    }

    private static func file(_ value: TOMLValue?, place: String) throws -> String? {
        guard let value else { return nil }
        guard let path = value.string, path.hasPrefix("/"), !path.hasSuffix("/"), !path.contains("\0"),
            path.utf8.count <= 4095
        else { throw ConfigError(description: "\(place) must be the absolute path of a file") }
        return path
    }

    /// Whether `host` is this machine's loopback (where TLS protects nothing another host sees).
    package static func isLoopback(_ host: String) -> Bool {
        host == "localhost" || host == "::1"
            || host.hasPrefix("127.")
                && host.split(separator: ".").count == 4 && host.split(separator: ".").allSatisfy { UInt8($0) != nil }
    }

    private static func isHostName(_ text: String) -> Bool {
        (1...64).contains(text.utf8.count)
            && text.utf8.allSatisfy {
                ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x7A) || $0 == 0x2E || $0 == 0x2D
                    || $0 == 0x5F
            }
    }

    /// This machine's host name, cut to a valid fleet host name ("localhost" when it has none).
    private static func localHostName() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "localhost" }
        let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let cut = String(name.prefix(64))
        return isHostName(cut) ? cut : "localhost"
    }
}
