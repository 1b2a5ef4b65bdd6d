import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// The two secrets a broker needs to join its fleet, read from private files: the fleet key
/// (`[fleet] key_file`, else systemd's `$CREDENTIALS_DIRECTORY/fleet-key`) and the database
/// password (`[fleet] password_file`, else `$CREDENTIALS_DIRECTORY/fleet-db-password` when
/// there is one, else none).
public struct FleetCredentials: Sendable {
    public let key: SecretKey
    /// The database password. A `String`, as the PostgreSQL client takes it: outside guarded
    /// memory, for as long as the client lives.
    public let password: String?

    /// The longest password file read.
    package static let passwordLimit = 4096

    public init(settings: FleetSettings, environment: [String: String]) throws {
        let credentials = environment["CREDENTIALS_DIRECTORY"].flatMap { $0.isEmpty ? nil : $0 }
        guard let keyPath = settings.keyFile ?? credentials.map({ $0 + "/fleet-key" }) else {
            throw FleetError(
                "no fleet key: set fleet.key_file, or give brokerd the credential fleet-key (LoadCredentialEncrypted=)")
        }
        key = try FleetKey.load(path: keyPath)
        let passwordPath = settings.passwordFile ?? credentials.map { $0 + "/fleet-db-password" }
        guard let passwordPath,
            var bytes = try FileSystem.readPrivateFile(
                passwordPath, role: "fleet database password", limit: Self.passwordLimit)
        else {
            if let file = settings.passwordFile { throw FleetError("no database password at \(file)") }
            password = nil
            return
        }
        defer { Sodium.wipe(&bytes) }
        guard bytes.count < Self.passwordLimit else {
            throw FleetError(
                "the database password file \(passwordPath) is \(Self.passwordLimit) bytes or more; a password is one line"
            )
        }
        // One line; the newline an editor adds is not part of it.
        let text = String(decoding: bytes, as: UTF8.self)
        password = String(text.prefix { $0 != "\n" && $0 != "\r" })
    }
}
