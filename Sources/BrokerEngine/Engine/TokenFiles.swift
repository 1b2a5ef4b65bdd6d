import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// The token files the broker keeps fresh (`[accounts.NAME] export_file`, and the WLCG bearer
/// token file of `[broker] wlcg_account`), as Vault Agent's file sink does: each holds the
/// account's servable access token and nothing else, rewritten whenever that token changes and
/// removed when the account has none. A failed write is logged and changes nothing else.
package struct TokenFiles {
    /// The files kept for each account.
    private(set) var paths: [String: [String]] = [:]

    /// The files `configuration` asks for: each account's `export_file`, plus the WLCG file
    /// (`wlcgFile`) for `wlcg_account`.
    package static func paths(for configuration: BrokerConfiguration, wlcgFile: String?) -> [String: [String]] {
        var paths = configuration.exportFiles.mapValues { [$0] }
        if let account = configuration.wlcgAccount, let wlcgFile, paths[account]?.contains(wlcgFile) != true {
            paths[account, default: []].append(wlcgFile)
        }
        return paths
    }

    /// Takes `newPaths`; removes each file no longer asked for. Returns the accounts whose
    /// files to write now. Logs each file whose directory is read-only to this process, at start
    /// and reload, before any token is there to write.
    package mutating func replace(with newPaths: [String: [String]], logger: Logger) -> [String] {
        let kept = Set(newPaths.values.joined())
        for path in paths.values.joined() where !kept.contains(path) { Self.remove(path, logger: logger) }
        paths = newPaths
        for path in kept.sorted() {
            let directory = FileSystem.parent(of: path)
            var info = statvfs()
            if statvfs(directory, &info) == 0, info.f_flag & UInt(ST_RDONLY) != 0 {
                logger.error(
                    "token file cannot be written",
                    metadata: ["reason": "refusing the token file \(path): \(Self.readOnly(directory))"])
            }
        }
        return Array(newPaths.keys)
    }

    /// Why a file in `directory` cannot be written when its file system is read-only, and what to
    /// do: the systemd unit's ProtectSystem=strict leaves writable only what its ReadWritePaths=
    /// lists (docs/bridges.md, "Token files kept fresh").
    private static func readOnly(_ directory: String) -> String {
        "its directory \(directory) is read-only to brokerd; under the systemd unit, add ReadWritePaths=\(directory) "
            + "under [Service] in a drop-in (systemctl --user edit tokenbroker.service) and restart the service"
    }

    /// Writes `token` into each file of `account`, or removes them when it holds none.
    package func update(_ account: String, token: AccessToken?, logger: Logger) {
        for path in paths[account] ?? [] {
            // A DPoP-bound token is useless without a proof, which a program reading a file
            // cannot make: the file is removed rather than kept with it.
            if let token, TokenType.isDPoP(token.type) {
                logger.warning(
                    "no token file for a DPoP-bound token: use brokerctl header --method --url, or a client's dpop_headers",
                    metadata: ["account": "\(account)", "path": "\(JSONText.quote(path))"])
                Self.remove(path, logger: logger)
            } else if let token {
                Self.write(token.value, to: path, account: account, logger: logger)
            } else {
                Self.remove(path, logger: logger)
            }
        }
    }

    /// Removes every file (the broker locks and forgets its tokens).
    package func removeAll(logger: Logger) {
        for path in paths.values.joined() { Self.remove(path, logger: logger) }
    }

    /// Writes `secret` (straight from guarded memory) to `path` atomically: a fresh 0600 file
    /// beside it (`O_EXCL`, no link followed), fsync'd, renamed over it, the directory fsync'd.
    /// Refuses a directory that is not this user's or that group or others may write, and
    /// anything but a regular file at `path`.
    private static func write(_ secret: SecretBytes, to path: String, account: String, logger: Logger) {
        do {
            let directory = try TokenFileDirectory(holding: path)
            defer { directory.close() }
            try directory.checkReplaceable()
            let staging = ".\(directory.name).tokenbroker-\(UInt32.random(in: 0...UInt32.max))"
            let fd = openat(directory.fd, staging, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard fd >= 0 else {
                if errno == EROFS { throw directory.refusal(Self.readOnly(FileSystem.parent(of: path))) }
                throw directory.refusal("cannot create a file beside it: \(FileSystem.errnoText())")
            }
            var written = false
            defer {
                close(fd)
                if !written { unlinkat(directory.fd, staging, 0) }
            }
            guard fchmod(fd, 0o600) == 0 else { throw directory.refusal("cannot write it: \(FileSystem.errnoText())") }
            try secret.withUnsafeBytes { try FileSystem.writeAll($0, to: fd, role: "token file", path: path) }
            guard fsync(fd) == 0 else { throw directory.refusal("cannot write it: \(FileSystem.errnoText())") }
            guard renameat(directory.fd, staging, directory.fd, directory.name) == 0 else {
                throw directory.refusal("cannot rename the new file over it: \(FileSystem.errnoText())")
            }
            written = true
            _ = fsync(directory.fd)
        } catch {
            logger.error("token file not written", metadata: ["account": "\(account)", "reason": "\(error)"])
        }
    }

    /// Removes the file at `path` when it is a regular file in a directory of this user's.
    private static func remove(_ path: String, logger: Logger) {
        do {
            let directory = try TokenFileDirectory(holding: path)
            defer { directory.close() }
            guard try directory.checkReplaceable() else { return }
            guard unlinkat(directory.fd, directory.name, 0) == 0 else {
                throw directory.refusal("cannot remove it: \(FileSystem.errnoText())")
            }
            _ = fsync(directory.fd)
        } catch {
            logger.error("token file not removed", metadata: ["reason": "\(error)"])
        }
    }
}

/// The directory of a token file, open without following a link, checked to be this user's
/// and writable by no one else.
private struct TokenFileDirectory {
    let path: String
    let name: String
    let fd: Int32

    init(holding path: String) throws {
        self.path = path
        name = String(path.split(separator: "/", omittingEmptySubsequences: false).last ?? "")
        let directory = FileSystem.parent(of: path)
        fd = open(directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            throw FileAccessError(
                "refusing the token file \(path): cannot open its directory \(directory) "
                    + "(\(FileSystem.errnoText()); a symbolic link is not followed)")
        }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_uid == getuid(), info.st_mode & 0o022 == 0 else {
            Glibc.close(fd)
            throw FileAccessError(
                "refusing the token file \(path): its directory \(directory) must be yours and writable by no one "
                    + "else (chmod go-w)")
        }
    }

    func close() { Glibc.close(fd) }

    func refusal(_ reason: String) -> FileAccessError {
        FileAccessError("refusing the token file \(path): \(reason)")
    }

    /// Whether a file is at the path; throws when something other than a regular file is (a
    /// symbolic link, a directory), which is never replaced or removed.
    @discardableResult
    func checkReplaceable() throws -> Bool {
        var info = stat()
        guard fstatat(fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else {
            guard errno == ENOENT else { throw refusal("cannot check it: \(FileSystem.errnoText())") }
            return false
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw refusal("it is not a regular file (a symbolic link?); remove it")
        }
        return true
    }
}
