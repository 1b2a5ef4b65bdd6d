import BrokerModel
import CFileSpace
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// A file or directory brokerd cannot use or will not trust. The message names the path and
/// says what fixes it (a `chmod`, another location); it never holds a secret.
public struct FileAccessError: Error, CustomStringConvertible, Sendable {
    public let description: String

    package init(_ description: String) { self.description = description }
}

/// POSIX helpers for brokerd's private files and directories. No symbolic link is followed
/// to a state file, and nothing that another user could have written (or can read) is used.
/// Every such check brokerd makes is in this one file, so that an audit of what it trusts
/// reads them together.
public enum FileSystem {
    // MARK: Directories

    /// Makes `path` a directory that only this user can change, creating it and its missing
    /// parents with mode 0700. The path is walked from the root as the kernel would, one
    /// `lstat` at a time: a symbolic link above the directory is followed (and the
    /// directories it leads through are checked in turn), the directory itself must not be
    /// one. The directory and every directory created here belong to this uid and are not
    /// writable by group or others; every directory passed through on the way belongs to this
    /// uid or root and no one else may write it, unless it is a root-owned sticky directory
    /// such as /tmp. A directory that was already there is never chmod'ed. `role` names the
    /// directory in messages ("socket directory"); `remedy` says what else the user can do.
    public static func preparePrivateDirectory(_ path: String, role: String, remedy: String) throws {
        let refuse = { (reason: String) in FileAccessError("refusing the \(role) \(path): \(reason)") }
        var pending = components(of: try absolute(path))
        guard let last = pending.last, last != ".", last != ".." else {
            throw refuse("it is not a plain directory path; \(remedy)")
        }
        var current = "/"
        try checkPassedThrough(current, info: status(of: current, refuse: refuse), refuse: refuse, remedy: remedy)
        var creating = false
        var linksFollowed = 0
        while let name = pending.popFirst() {
            if name == "." { continue }
            if name == ".." {
                current = parent(of: current)
                continue
            }
            let next = current == "/" ? "/" + name : current + "/" + name
            let isTarget = pending.isEmpty
            var info = stat()
            if !creating, lstat(next, &info) != 0 {
                guard errno == ENOENT else { throw refuse("cannot check \(next): \(errnoText())") }
                creating = true
            }
            if creating || isTarget {
                if creating, mkdir(next, 0o700) != 0, errno != EEXIST {
                    throw FileAccessError("cannot create the \(role) \(next): \(errnoText())")
                }
                try checkOwnDirectory(next, called: isTarget ? "it" : next, refuse: refuse, remedy: remedy)
            } else if info.st_mode & S_IFMT == S_IFLNK {
                linksFollowed += 1
                guard linksFollowed <= 40, let target = linkTarget(next) else {
                    throw refuse("cannot follow the symbolic link \(next); \(remedy)")
                }
                // In a sticky directory another user may own a link and repoint it after this walk.
                guard info.st_uid == getuid() || info.st_uid == 0 else {
                    throw refuse(
                        "the symbolic link \(next) belongs to uid \(info.st_uid), so that user could repoint it; "
                            + remedy)
                }
                if target.hasPrefix("/") { current = "/" }
                pending = components(of: target) + pending
                continue
            } else {
                try checkPassedThrough(next, info: info, refuse: refuse, remedy: remedy)
            }
            current = next
        }
    }

    /// Checks a directory the walk to a private directory passes through: it belongs to this
    /// uid or root and only its owner may write it, unless root owns it and it is sticky
    /// (others cannot rename or delete what is ours there).
    private static func checkPassedThrough(
        _ path: String, info: stat, refuse: (String) -> FileAccessError, remedy: String
    ) throws {
        guard info.st_mode & S_IFMT == S_IFDIR else { throw refuse("\(path) is not a directory; \(remedy)") }
        let trustedOwner = info.st_uid == getuid() || info.st_uid == 0
        let sharedButSticky = info.st_uid == 0 && info.st_mode & S_ISVTX != 0
        guard trustedOwner else {
            throw refuse("\(path) above it belongs to uid \(info.st_uid), who could replace what is inside; \(remedy)")
        }
        guard info.st_mode & 0o022 == 0 || sharedButSticky else {
            let fix = info.st_uid == getuid() ? "run: chmod go-w \(path), or " : ""
            throw refuse(
                "\(path) above it is writable by group or others (mode \(octal(info.st_mode))) and is not a "
                    + "root-owned sticky directory like /tmp, so another user could replace what is inside; "
                    + fix + remedy)
        }
    }

    /// Checks the directory at `path` itself: not a link, this uid's, not writable by others.
    /// `name` is how messages call it ("it" for the directory asked for).
    private static func checkOwnDirectory(
        _ path: String, called name: String, refuse: (String) -> FileAccessError, remedy: String
    ) throws {
        let info = try status(of: path, refuse: refuse)
        switch info.st_mode & S_IFMT {
        case S_IFDIR: break
        case S_IFLNK: throw refuse("\(name) is a symbolic link, which brokerd does not follow here; \(remedy)")
        default: throw refuse("\(name) is not a directory; \(remedy)")
        }
        guard info.st_uid == getuid() else {
            throw refuse(
                "\(name) belongs to uid \(info.st_uid), not to you (uid \(getuid())), so that user could "
                    + "replace what is inside; remove it, or \(remedy)")
        }
        guard info.st_mode & 0o022 == 0 else {
            throw refuse(
                "\(name) is writable by group or others (mode \(octal(info.st_mode))); run: chmod go-w \(path), or "
                    + remedy)
        }
    }

    // MARK: Files

    /// Opens `path` without following a symbolic link (`O_NOFOLLOW`, close-on-exec; created
    /// with mode 0600 under `O_CREAT`) and checks what was opened (`fstat`): a regular file of
    /// this uid that no one else may read or write, as ssh demands of a private key. `role`
    /// names the file in messages ("vault key").
    package static func openPrivateFile(_ path: String, role: String, flags: Int32) throws -> Int32 {
        guard let file = try openCheckedFileIfPresent(path, role: role, flags: flags, trust: .ownPrivate) else {
            throw FileAccessError("cannot open the \(role) \(path): \(String(cString: strerror(ENOENT)))")
        }
        return file.fd
    }

    /// The content of the private file at `path` (see `openPrivateFile`), as long as `fstat`
    /// said it was but at most `limit` bytes; `nil` when it does not exist. The caller wipes it
    /// when it holds a secret.
    package static func readPrivateFile(_ path: String, role: String, limit: Int = .max) throws -> Data? {
        guard let (fd, info) = try openCheckedFileIfPresent(path, role: role, flags: O_RDONLY, trust: .ownPrivate)
        else { return nil }
        defer { close(fd) }
        return try readContent(fd, limit: min(limit, Int(info.st_size)), path: path, role: role)
    }

    /// Opens the private file at `path` with `flags` (see `openPrivateFile`) and reads it whole;
    /// `nil` when it does not exist. The caller closes the descriptor.
    package static func openAndReadPrivateFile(_ path: String, role: String, flags: Int32) throws -> (
        fd: Int32, content: Data
    )? {
        guard let (fd, info) = try openCheckedFileIfPresent(path, role: role, flags: flags, trust: .ownPrivate)
        else { return nil }
        do {
            return (fd, try readContent(fd, limit: Int(info.st_size), path: path, role: role))
        } catch {
            close(fd)
            throw error
        }
    }

    /// What `pread` gives from the start of `fd` until the end of the file, or until `limit`
    /// bytes (from the start whatever the descriptor's offset or `O_APPEND`). On an error the
    /// bytes read so far are wiped.
    private static func readContent(_ fd: Int32, limit: Int, path: String, role: String) throws -> Data {
        var bytes = Data(count: limit)
        var filled = 0
        while filled < bytes.count {
            let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + filled, $0.count - filled, filled) }
            if count == 0 { break }
            if count < 0 {
                if errno == EINTR { continue }
                let reason = errnoText()
                Sodium.wipe(&bytes)
                throw FileAccessError("cannot read the \(role) \(path): \(reason)")
            }
            filled += count
        }
        bytes.count = filled
        return bytes
    }

    /// Creates `path` afresh, mode 0600, for writing: a stale file or a planted link there is
    /// removed first (not followed), and `O_EXCL` refuses whatever appears in between.
    /// `flags` are added to `O_WRONLY | O_CREAT | O_EXCL` (`O_APPEND`, say).
    package static func createPrivateFile(_ path: String, role: String, flags: Int32 = 0) throws -> Int32 {
        guard unlink(path) == 0 || errno == ENOENT else {
            throw FileAccessError("cannot replace the \(role) \(path): \(errnoText())")
        }
        return try openPrivateFile(path, role: role, flags: O_WRONLY | O_CREAT | O_EXCL | flags)
    }

    /// The content of a file the user hands brokerd (a secrets file), at most `limit` bytes:
    /// opened without following a symbolic link, a regular file of this uid. `nil` when it
    /// does not exist. The caller wipes it when it holds a secret.
    package static func readOwnedFile(_ path: String, role: String, limit: Int) throws -> Data? {
        guard let (fd, info) = try openCheckedFileIfPresent(path, role: role, flags: O_RDONLY, trust: .owned) else {
            return nil
        }
        defer { close(fd) }
        guard info.st_size <= limit else {
            throw FileAccessError("refusing the \(role) \(path): it is larger than \(limit / 1024) KiB")
        }
        return try readContent(fd, limit: Int(info.st_size), path: path, role: role)
    }

    /// Who may own a file brokerd opens, and who else may use it.
    package enum FileTrust {
        /// A file the user hands brokerd to read once: this uid's.
        case owned
        /// brokerd's own files (vault, vault key): this uid's, and no one else may read or write them.
        case ownPrivate
        /// A file another program of this user keeps (a token file): this uid's or root's, and no
        /// one else may write it.
        case keptByUserOrRoot
    }

    /// Opens `path` (relative to `directory` when one is given) without following a symbolic
    /// link, and checks what was opened against `trust`; returns it with what `fstat` said, or
    /// `nil` when nothing is there.
    private static func openCheckedFileIfPresent(
        _ path: String, in directory: Int32 = AT_FDCWD, named name: String? = nil, role: String, flags: Int32,
        trust: FileTrust
    ) throws -> (fd: Int32, info: stat)? {
        let fd = openat(directory, name ?? path, flags | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            switch errno {
            case ENOENT: return nil
            case ELOOP:
                throw FileAccessError(
                    "refusing the \(role) \(path): it is a symbolic link, which brokerd does not follow; "
                        + "put the file itself there")
            default: throw FileAccessError("cannot open the \(role) \(path): \(errnoText())")
            }
        }
        do {
            return (fd, try checkFile(fd, path: path, role: role, trust: trust))
        } catch {
            close(fd)
            throw error
        }
    }

    /// Refuses an open file that is not a regular file, or whose owner or mode `trust` does not
    /// allow; the message names the file and the command that fixes it. Returns what `fstat` said.
    private static func checkFile(_ fd: Int32, path: String, role: String, trust: FileTrust) throws -> stat {
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw FileAccessError("cannot check the \(role) \(path): \(errnoText())") }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw FileAccessError("refusing the \(role) \(path): it is not a regular file")
        }
        switch trust {
        case .owned:
            guard info.st_uid == getuid() else {
                throw FileAccessError(
                    "refusing the \(role) \(path): it belongs to uid \(info.st_uid), not to you (uid \(getuid()))")
            }
        case .ownPrivate:
            guard info.st_uid == getuid() else {
                throw FileAccessError(
                    "refusing the \(role) \(path): it belongs to uid \(info.st_uid), not to you (uid \(getuid())); "
                        + "brokerd uses only its own files: run (as root) chown \(getuid()) \(path)")
            }
            guard info.st_mode & 0o077 == 0 else {
                throw FileAccessError(
                    "refusing the \(role) \(path): others can read or write it (mode \(octal(info.st_mode))), "
                        + "so it is not private; run: chmod 600 \(path)")
            }
        case .keptByUserOrRoot:
            guard info.st_uid == getuid() || info.st_uid == 0 else {
                throw FileAccessError(
                    "refusing the \(role) \(path): it belongs to uid \(info.st_uid), neither you (uid \(getuid())) "
                        + "nor root, so that user could write what brokerd serves")
            }
            guard info.st_mode & 0o022 == 0 else {
                throw FileAccessError(
                    "refusing the \(role) \(path): group or others can write it (mode \(octal(info.st_mode))); "
                        + "run: chmod go-w \(path)")
            }
        }
        return info
    }

    // MARK: Files other programs keep

    /// The content of a file that another program of this user keeps up to date (a token
    /// file), at most `limit` bytes, and when it was last modified. Its directory must belong
    /// to this uid or root and be writable by no one else (unless it is root-owned and sticky,
    /// like /tmp); the file, opened inside that very directory without following a symbolic
    /// link and without waiting on a FIFO, must be a regular file of this uid or root that no
    /// one else may write. `path` is absolute.
    package static func readKeptFile(_ path: String, role: String, limit: Int) throws -> (data: Data, modified: Date) {
        let refuse = { (reason: String) in FileAccessError("refusing the \(role) \(path): \(reason)") }
        let directory = parent(of: path)
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directoryFD >= 0 else { throw refuse("cannot open its directory: \(errnoText())") }
        defer { close(directoryFD) }
        var directoryInfo = stat()
        guard fstat(directoryFD, &directoryInfo) == 0 else {
            throw refuse("cannot check its directory: \(errnoText())")
        }
        try checkPassedThrough(
            directory, info: directoryInfo, refuse: refuse,
            remedy: "keep the file in a directory that only you (or root) can write")
        let name = String(path.split(separator: "/", omittingEmptySubsequences: false).last ?? "")
        guard
            let (fd, info) = try openCheckedFileIfPresent(
                path, in: directoryFD, named: name, role: role, flags: O_RDONLY | O_NONBLOCK, trust: .keptByUserOrRoot)
        else { throw FileAccessError("cannot open the \(role) \(path): \(String(cString: strerror(ENOENT)))") }
        defer { close(fd) }
        guard info.st_size <= limit else {
            throw refuse("it holds \(info.st_size) bytes, more than the \(limit) bytes brokerd reads")
        }
        let data = try readContent(fd, limit: limit + 1, path: path, role: role)
        guard data.count <= limit else { throw refuse("it grew past \(limit) bytes while it was read") }
        let modified = Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9
        return (data, Date(timeIntervalSince1970: modified))
    }

    /// What `stat` says of a file and of the directory holding it, compared between polls: a
    /// file rewritten, replaced, touched or given another owner or mode reads differently, as
    /// does a directory replaced or given another owner or mode. A path that cannot be checked
    /// reads as its error.
    package struct Stamp: Equatable, Sendable {
        private let file: [Int]
        private let directory: [Int]

        package init(of path: String) {
            var info = stat()
            file =
                lstat(path, &info) == 0
                ? Self.identity(info) + [
                    Int(info.st_size), info.st_mtim.tv_sec, info.st_mtim.tv_nsec, info.st_ctim.tv_sec,
                    info.st_ctim.tv_nsec,
                ] : [-Int(errno)]
            directory = stat(FileSystem.parent(of: path), &info) == 0 ? Self.identity(info) : [-Int(errno)]
        }

        private static func identity(_ info: stat) -> [Int] {
            [
                Int(truncatingIfNeeded: info.st_dev), Int(truncatingIfNeeded: info.st_ino), Int(info.st_mode),
                Int(info.st_uid),
            ]
        }
    }

    // MARK: Durable writes

    /// Writes `data` to a fresh `staging` file (see `createPrivateFile`) and fsyncs it, so it
    /// can then be renamed over the file it replaces (`replace`); a failed write removes it.
    package static func writeStagingFile(_ data: Data, at staging: String) throws {
        let fd = try createPrivateFile(staging, role: "staging file")
        defer { close(fd) }
        do {
            try writeAll(data, to: fd, role: "staging file", path: staging)
            guard fsync(fd) == 0 else {
                throw FileAccessError("cannot write the staging file \(staging): \(errnoText())")
            }
        } catch {
            unlink(staging)
            throw error
        }
    }

    /// Makes a complete `staging` file durable and renames it over `path`, durably.
    package static func promote(_ staging: String, to path: String) throws {
        let fd = try openPrivateFile(staging, role: "staging file", flags: O_RDONLY)
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw FileAccessError("cannot sync the staging file \(staging): \(errnoText())") }
        try replace(path, with: staging)
        try syncDirectory(of: path)
    }

    /// Renames `staging` over `path`; a failed rename leaves `staging` in place. The rename is
    /// durable once `syncDirectory(of: path)` returns.
    package static func replace(_ path: String, with staging: String) throws {
        guard Glibc.rename(staging, path) == 0 else {
            throw FileAccessError("cannot replace \(path): \(errnoText())")
        }
    }

    /// Fsyncs the directory holding `path`, so that names created, renamed or removed there last.
    package static func syncDirectory(of path: String) throws {
        let directory = parent(of: path)
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directoryFD >= 0 else { throw FileAccessError("cannot open \(directory): \(errnoText())") }
        defer { close(directoryFD) }
        guard fsync(directoryFD) == 0 else { throw FileAccessError("cannot sync \(directory): \(errnoText())") }
    }

    /// Writes `bytes` at `offset` of the file open at `fd` and waits until they are on disk
    /// (`fdatasync`), retrying after a signal or a short write.
    package static func writeDurably(_ bytes: [UInt8], to fd: Int32, at offset: Int, role: String, path: String) throws
    {
        try bytes.withUnsafeBytes { buffer in
            var done = 0
            while done < buffer.count {
                let written = pwrite(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset + done))
                if written < 0, errno == EINTR { continue }
                guard written > 0 else { throw FileAccessError("cannot write the \(role) \(path): \(errnoText())") }
                done += written
            }
        }
        guard fdatasync(fd) == 0 else { throw FileAccessError("cannot sync the \(role) \(path): \(errnoText())") }
    }

    /// Allocates `length` bytes of the file open at `fd` from `offset`, beyond its end, without
    /// changing its size, so that writes there need no new blocks. `nil` when done, else why not
    /// (`unsupported` when the filesystem cannot).
    package static func allocateAhead(_ fd: Int32, from offset: Int, length: Int) -> (
        reason: String, unsupported: Bool
    )? {
        var error: Int32
        repeat { error = tb_allocate_keeping_size(fd, Int64(offset), Int64(length)) } while error == EINTR
        guard error != 0 else { return nil }
        return (String(cString: strerror(error)), [EOPNOTSUPP, ENOSYS].contains(error))
    }

    /// Cuts the file open at `fd` to `length` bytes, durably.
    package static func truncateDurably(_ fd: Int32, to length: Int, role: String, path: String) throws {
        guard ftruncate(fd, off_t(length)) == 0, fsync(fd) == 0 else {
            throw FileAccessError("cannot shorten the \(role) \(path): \(errnoText())")
        }
    }

    /// Writes every byte of `bytes` at `fd`'s position, retrying after a signal or a short write.
    package static func writeAll(_ bytes: some ContiguousBytes, to fd: Int32, role: String, path: String) throws {
        try bytes.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0, errno == EINTR { continue }
                guard written > 0 else { throw FileAccessError("cannot write the \(role) \(path): \(errnoText())") }
                offset += written
            }
        }
    }

    // MARK: Paths

    /// The directory holding `path` (`.` for a bare name).
    public static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// `path` made absolute against the working directory.
    private static func absolute(_ path: String) throws -> String {
        if path.hasPrefix("/") { return path }
        guard let cwd = getcwd(nil, 0) else {
            throw FileAccessError("cannot tell where the relative path \(path) lies: \(errnoText())")
        }
        defer { free(cwd) }
        return String(cString: cwd) + "/" + path
    }

    /// The names in `path`, in order (empty ones dropped).
    private static func components(of path: String) -> ArraySlice<String> {
        ArraySlice(path.split(separator: "/").map(String.init))
    }

    /// What the symbolic link at `path` points to; `nil` when it cannot be read.
    private static func linkTarget(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlink(path, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `lstat` of `path`, or the refusal saying why it cannot be checked.
    private static func status(of path: String, refuse: (String) -> FileAccessError) throws -> stat {
        var info = stat()
        guard lstat(path, &info) == 0 else { throw refuse("cannot check \(path): \(errnoText())") }
        return info
    }

    /// The permission bits of `mode` as `chmod` writes them, e.g. `0644`.
    private static func octal(_ mode: mode_t) -> String {
        let digits = String(mode & 0o7777, radix: 8)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }

    package static func errnoText() -> String { String(cString: strerror(errno)) }
}
