import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What names the process that connected, for reading `/proc` later: its pidfd
/// (`SO_PEERPIDFD`), or on a kernel without one, its `/proc` directory opened at accept.
final class PeerProcess: Sendable {
    let pid: Int32
    private let pidfd: Int32?
    private let directory: ProcessDirectory?
    /// With a pidfd, the `/proc/PID` directory `stillRuns` opened first and keeps, so that each
    /// later request pays one `fstatat` rather than an open, a poll and a close.
    private let kept = Mutex<ProcessDirectory?>(nil)

    /// Takes over `pidfd` (closed with this).
    init(pid: Int32, pidfd: Int32?) {
        self.pid = pid
        self.pidfd = pidfd
        directory = pidfd == nil ? ProcessDirectory(pid: pid) : nil
    }

    deinit { if let pidfd { close(pidfd) } }

    /// Reads the process's facts, or `nil` when it has exited. With a pidfd, `/proc/PID` is
    /// opened and read, and then the pidfd asked whether that process still runs: had it
    /// exited, its pid might have gone to another program before the reads. Without one, the
    /// directory held since accept reads nothing once its process is gone.
    func read(with reader: any ProcessReader) -> ProcessFacts? {
        guard let pidfd else { return directory.map(reader.facts) }
        guard pid > 0, let directory = ProcessDirectory(pid: pid) else { return nil }
        let facts = reader.facts(of: directory)
        return Self.hasExited(pidfd) ? nil : facts
    }

    /// Whether the process still runs and runs `file`, the executable's file it ran at accept
    /// (`nil`: unreadable then, as another user's is): the check a request pays for an account
    /// whose rule names programs. With a pidfd, the `/proc/PID` directory is opened once and
    /// kept: opened while the pidfd's process still ran (asked after the first read), it names
    /// no other process even once the pid is reused, and a process that has exited shows no
    /// executable through it, so a later read that finds `file` needs no poll.
    func stillRuns(_ file: FileIdentity?, with reader: any ProcessReader) -> Bool {
        guard let pidfd else { return directory.map { reader.executableFile(of: $0) == file } ?? false }
        let (directory, opened) = kept.withLock { kept -> (ProcessDirectory?, Bool) in
            if let directory = kept { return (directory, false) }
            kept = pid > 0 ? ProcessDirectory(pid: pid) : nil
            return (kept, true)
        }
        guard let directory else { return false }
        let now = reader.executableFile(of: directory)
        guard now == file else { return false }
        return (now != nil && !opened) || !Self.hasExited(pidfd)
    }

    /// The pid of the process's parent now (`/proc/PID/stat`), or `nil` once it has exited.
    func parentPID() -> Int32? {
        guard let pidfd else { return directory.flatMap(ProcessStat.parentPID(of:)) }
        guard pid > 0, let directory = ProcessDirectory(pid: pid) else { return nil }
        let parent = ProcessStat.parentPID(of: directory)
        return Self.hasExited(pidfd) ? nil : parent
    }

    /// Whether the process behind `pidfd` has exited (a pidfd polls readable then).
    private static func hasExited(_ pidfd: Int32) -> Bool {
        var entry = pollfd(fd: pidfd, events: Int16(POLLIN), revents: 0)
        while true {
            let ready = poll(&entry, 1, 0)
            if ready < 0, errno == EINTR { continue }
            return ready != 0
        }
    }
}

/// A process's `/proc/PID` directory, held open: what is read through it names the process
/// that held the pid when it was opened, or fails once that process is gone (the kernel does
/// not hand a stale directory to the pid's next owner).
public final class ProcessDirectory: Sendable {
    public let pid: Int32
    let descriptor: Int32

    /// Opens `/proc/PID`; `nil` when no process has that pid.
    init?(pid: Int32) {
        let descriptor = open("/proc/\(pid)", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return nil }
        self.pid = pid
        self.descriptor = descriptor
    }

    deinit { close(descriptor) }
}

/// Reads a process's executable and unit; tests inject one to stand for a process whose pid
/// was reused by another program between the checks.
public protocol ProcessReader: Sendable {
    func facts(of process: ProcessDirectory) -> ProcessFacts
    /// The executable's file alone; by default, from `facts(of:)`.
    func executableFile(of process: ProcessDirectory) -> FileIdentity?
}

extension ProcessReader {
    public func executableFile(of process: ProcessDirectory) -> FileIdentity? {
        facts(of: process).executable?.file
    }
}

/// Reads `exe` (the link and the file it names) and `cgroup` in a process's `/proc` directory.
public struct ProcFileSystemReader: ProcessReader {
    /// The most of a `cgroup` file read (a path per hierarchy; a few hundred bytes in practice).
    static let cgroupFileLimit = 16 * 1024

    public init() {}

    public func facts(of process: ProcessDirectory) -> ProcessFacts {
        ProcessFacts(executable: executable(of: process), unit: unit(of: process))
    }

    /// One `fstatat` of `exe`: no path read, no cgroup file.
    public func executableFile(of process: ProcessDirectory) -> FileIdentity? {
        var info = stat()
        guard fstatat(process.descriptor, "exe", &info, 0) == 0 else { return nil }
        return FileIdentity(info)
    }

    private func executable(of process: ProcessDirectory) -> Executable? {
        var info = stat()
        guard fstatat(process.descriptor, "exe", &info, 0) == 0 else { return nil }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlinkat(process.descriptor, "exe", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        let path = String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return Executable(path: path, file: FileIdentity(info))
    }

    private func unit(of process: ProcessDirectory) -> String? {
        let file = openat(process.descriptor, "cgroup", O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard file >= 0 else { return nil }
        defer { close(file) }
        var bytes = [UInt8](repeating: 0, count: Self.cgroupFileLimit)
        var filled = 0
        while filled < bytes.count {
            let count = bytes.withUnsafeMutableBytes { read(file, $0.baseAddress! + filled, $0.count - filled) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { break }
            filled += count
        }
        guard filled < bytes.count else { return nil }
        return SystemdUnit.unit(fromCgroupFile: String(decoding: bytes[..<filled], as: UTF8.self))
    }
}

/// Reads `/proc/PID/stat`, whose second field (the command, in parentheses) may hold any
/// character: the fields after it are found from its last closing parenthesis.
enum ProcessStat {
    /// Longest `stat` file read (about 300 bytes in practice).
    static let limit = 4096

    /// The fourth field, the parent's pid.
    static func parentPID(of process: ProcessDirectory) -> Int32? {
        let file = openat(process.descriptor, "stat", O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard file >= 0 else { return nil }
        defer { close(file) }
        var bytes = [UInt8](repeating: 0, count: limit)
        let count = bytes.withUnsafeMutableBytes { read(file, $0.baseAddress!, $0.count) }
        guard count > 0, count < limit, let command = bytes[..<count].lastIndex(of: UInt8(ascii: ")")) else {
            return nil
        }
        // ") S 1234 ...": the state, then the parent's pid.
        let fields = bytes[(command + 1)..<count].split(separator: UInt8(ascii: " "))
        guard fields.count > 2 else { return nil }
        return Int32(String(decoding: fields[fields.startIndex + 1], as: UTF8.self))
    }
}
