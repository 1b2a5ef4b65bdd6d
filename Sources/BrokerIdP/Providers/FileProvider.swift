import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Settings of a `file` account.
public struct FileSettings: Codable, Sendable, Equatable {
    /// The token file, an absolute path.
    public var path: String
}

extension FileSettings: ProviderSettings {
    package static let kind = "file"
    package static let fields = [ProviderField(name: "path", type: .text)]
    /// Polled every 2 seconds: a `stat` of the file and of its directory.
    package static let renewal = Renewal.watches(pollInterval: 2)

    /// An absolute path shorter than `PATH_MAX` bytes, without NUL, naming a file (not ending in `/`).
    package init(checking fields: ProviderFields) throws(BrokerFailure) {
        guard let path = try fields.text("path"), !path.isEmpty else {
            throw .invalid("a file provider needs \"path\", the token file")
        }
        guard path.hasPrefix("/"), !path.hasSuffix("/") else {
            throw .invalid("\"path\" must be the absolute path of a file")
        }
        guard !path.utf8.contains(0), path.utf8.count < Int(PATH_MAX) else {
            throw .invalid("\"path\" must be shorter than \(PATH_MAX) bytes, without NUL")
        }
        self.path = path
    }

    package func makeProvider(_ context: ProviderContext) -> any TokenProvider {
        FileProvider(settings: self, defaultLifetime: context.settings.defaultLifetime)
    }
}

/// `file` accounts: the token in a JSON file that another program keeps (a cron job, a login
/// helper), as `exec` commands print it: `access_token`, `expires_in` or `expires_at`,
/// `token_type`?. `expires_in` counts from the file's modification time.
///
/// The file is read again when it changes: the engine polls `sourceChanged()`, and reads it on
/// demand too. A file that others could have written (it or its directory writable by group or
/// others, or owned by another user than this one or root), a symbolic link, a file over 64 KiB,
/// bad JSON or an expired token is a transient failure whose message names the path and what
/// is wrong (never the token); the last good token is served until it expires.
package final class FileProvider: TokenProvider {
    /// Largest file read.
    package static let sizeLimit = 64 << 10

    package let settings: FileSettings
    package let defaultLifetime: TimeInterval
    /// How the file and its directory looked when `refresh` last read them.
    private let lastRead = Mutex<FileSystem.Stamp?>(nil)

    package init(settings: FileSettings, defaultLifetime: TimeInterval) {
        self.settings = settings
        self.defaultLifetime = defaultLifetime
    }

    package func sourceChanged() -> Bool {
        let stamp = FileSystem.Stamp(of: settings.path)
        return lastRead.withLock { $0 != stamp }
    }

    package func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        // Stamped before the read: a change during the read shows at the next poll.
        let stamp = FileSystem.Stamp(of: settings.path)
        lastRead.withLock { $0 = stamp }
        let file: (data: Data, modified: Date)
        do {
            file = try FileSystem.readKeptFile(settings.path, role: "token file", limit: Self.sizeLimit)
        } catch {
            return .failure(.transient("\(error)"))
        }
        return Self.interpret(
            file.data, modified: file.modified, path: settings.path, now: now, defaultLifetime: defaultLifetime)
    }

    /// The grant a token file's content gives: a JSON object with an `access_token` that has
    /// not expired. Lifetimes count from `modified` (or from `now`, if the file claims a future time).
    package static func interpret(_ data: Data, modified: Date, path: String, now: Date, defaultLifetime: TimeInterval)
        -> Result<Grant, RefreshFailure>
    {
        guard let object = JSONValue.object(decoding: data) else {
            return .failure(.transient("the token file \(path) does not hold a JSON object"))
        }
        return TokenDocument.read(
            object, issuedAt: min(modified, now), defaultLifetime: defaultLifetime, source: "the token file \(path)"
        ).flatMap { token in
            guard token.expiresAt > now else {
                return .failure(
                    .transient(
                        "the token in \(path) expired at \(Wire.rfc3339(token.expiresAt)); waiting for the file to "
                            + "be rewritten"))
            }
            return .success(Grant(token: token))
        }
    }
}
