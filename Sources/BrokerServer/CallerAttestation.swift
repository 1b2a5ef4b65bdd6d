import BrokerCore
import FoundationEssentials
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A file as the kernel knows it: the same device and inode are the same file whatever path
/// or link led to it.
public struct FileIdentity: Sendable, Equatable, Hashable {
    public var device: UInt64
    public var inode: UInt64

    public init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }

    init(_ info: stat) { self.init(device: UInt64(info.st_dev), inode: UInt64(info.st_ino)) }

    /// The file now at `path`, symbolic links followed; `nil` when there is none.
    public static func at(_ path: String) -> FileIdentity? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return FileIdentity(info)
    }
}

/// The program a process runs: the path the kernel shows for it (for people) and the file
/// itself (for rules).
public struct Executable: Sendable, Equatable {
    public var path: String
    public var file: FileIdentity

    public init(path: String, file: FileIdentity) {
        self.path = path
        self.file = file
    }
}

/// What `/proc` shows of a process: each part `nil` when it could not be read (another user's
/// executable, for a broker that is not root) or does not apply (a process in no unit).
public struct ProcessFacts: Sendable, Equatable {
    public var executable: Executable?
    public var unit: String?

    public init(executable: Executable?, unit: String?) {
        self.executable = executable
        self.unit = unit
    }
}

/// The process at the other end of a connection: its credentials and what `/proc` showed of it
/// when the connection was accepted, before any line was read. Those facts are the caller's for
/// the connection; a request is judged by them, and `isUnchanged` tells whether the process
/// still runs that program (it may have exec'ed another one since, keeping the socket).
public final class Caller: Sendable, CustomStringConvertible {
    public let peer: PeerIdentity
    private let process: PeerProcess?
    private let reader: any ProcessReader
    /// What `/proc` showed at accept; `nil` when the caller had exited by then.
    private let connected: ProcessFacts?
    /// For a caller that runs the bridge program (brokerctl beside brokerd): the program it
    /// works for, attested at accept (see `CallerAttestor.bridged(from:)`).
    public let bridged: BridgedProgram?

    init(
        peer: PeerIdentity, process: PeerProcess, reader: any ProcessReader, connected: ProcessFacts?,
        bridged: BridgedProgram?
    ) {
        self.peer = peer
        self.process = process
        self.reader = reader
        self.connected = connected
        self.bridged = bridged
    }

    /// A caller whose facts are known already (`nil`: it has exited), for tests of the rules.
    public init(peer: PeerIdentity, facts: ProcessFacts?, bridged: BridgedProgram? = nil) {
        self.peer = peer
        self.process = nil
        self.reader = ProcFileSystemReader()
        self.connected = facts
        self.bridged = bridged
    }

    /// What `/proc` showed of the caller when its connection was accepted; `nil` when it had
    /// exited by then.
    public func facts() -> ProcessFacts? { connected }

    /// What `/proc` shows of the caller now; `nil` when it has exited.
    public func currentFacts() -> ProcessFacts? {
        guard let process else { return connected }
        return process.read(with: reader)
    }

    /// Whether the caller still runs the executable it ran when it connected, and the program a
    /// bridge works for still runs too: a process that exec'ed another program (or exited, its
    /// socket kept by a child) is no longer the caller the facts describe. (Another user's
    /// executable cannot be read: such a caller only has to run still.)
    public func isUnchanged() -> Bool {
        guard let connected, let current = currentFacts(), current.executable?.file == connected.executable?.file
        else { return false }
        return bridged?.isUnchanged(with: reader) ?? true
    }

    /// uid, pid, executable and unit, for log lines (never anything the caller sent).
    public var description: String {
        guard let facts = connected else { return "uid \(peer.uid) pid \(peer.pid) (exited)" }
        let line =
            "uid \(peer.uid) pid \(peer.pid) executable \(Self.printable(facts.executable?.path)) unit "
            + Self.printable(facts.unit)
        guard let bridged else { return line }
        return line + " for pid \(bridged.pid) executable \(Self.printable(bridged.facts.executable?.path))"
    }

    /// `text` with control characters shown as `?`, so a file name cannot forge log lines.
    private static func printable(_ text: String?) -> String {
        guard let text else { return "(unknown)" }
        return String(
            String.UnicodeScalarView(text.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "?" : $0 }))
    }
}

/// The program a bridge (brokerctl run by git, docker or kubectl) works for: the nearest
/// ancestor of the caller that is not a shell, with what `/proc` showed of it at accept.
public struct BridgedProgram: Sendable {
    public let facts: ProcessFacts
    private let process: PeerProcess?

    init(process: PeerProcess, facts: ProcessFacts) {
        self.process = process
        self.facts = facts
    }

    /// A program whose facts are known already, for tests of the rules.
    public init(facts: ProcessFacts) {
        self.process = nil
        self.facts = facts
    }

    var pid: Int32 { process?.pid ?? 0 }

    /// Whether it still runs the executable it ran at accept.
    func isUnchanged(with reader: any ProcessReader) -> Bool {
        guard let process else { return true }
        guard let current = process.read(with: reader) else { return false }
        return current.executable?.file == facts.executable?.file
    }
}

/// What names the process that connected, for reading `/proc` later: its pidfd
/// (`SO_PEERPIDFD`), or on a kernel without one, its `/proc` directory opened at accept.
final class PeerProcess: Sendable {
    let pid: Int32
    private let pidfd: Int32?
    private let directory: ProcessDirectory?

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
}

/// Reads `exe` (the link and the file it names) and `cgroup` in a process's `/proc` directory.
public struct ProcFileSystemReader: ProcessReader {
    /// The most of a `cgroup` file read (a path per hierarchy; a few hundred bytes in practice).
    static let cgroupFileLimit = 16 * 1024

    public init() {}

    public func facts(of process: ProcessDirectory) -> ProcessFacts {
        ProcessFacts(executable: executable(of: process), unit: unit(of: process))
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

/// Attests callers from the kernel, as SPIRE's peertracker does: uid and pid from
/// `SO_PEERCRED` and a pidfd from `SO_PEERPIDFD` at accept, naming the very process that
/// connected; its executable and unit are read from `/proc` at once, each read followed by
/// asking the pidfd whether that process still runs (see `PeerProcess`).
public struct CallerAttestor: Sendable {
    /// `SO_PEERPIDFD` (Linux 6.5), which the C library's headers may not name yet.
    public static let peerPIDFDOption: Int32 = 77
    /// Most ancestors walked to find the program a bridge works for.
    static let maximumAncestors = 8
    /// Programs a bridge may be run through without being the program it works for: git runs
    /// a `!` helper through `/bin/sh -c`, and dash does not exec the last command.
    static let shells: Set<String> = [
        "sh", "dash", "bash", "zsh", "ksh", "ksh93", "mksh", "yash", "posh", "fish", "busybox",
    ]

    let reader: any ProcessReader
    /// The bridge program (brokerctl), by file: a caller running it is judged with the
    /// program it works for.
    let bridge: FileIdentity?

    public init(reader: any ProcessReader = ProcFileSystemReader(), bridge: FileIdentity? = Self.bridgeBesideBroker()) {
        self.reader = reader
        self.bridge = bridge
    }

    /// The caller behind `peer`. `pidfd` is its pidfd from `SO_PEERPIDFD` (taken over), or
    /// `nil` on a kernel without it: then its `/proc` directory is opened at once by pid, and
    /// a caller that exited before that may leave its pid to another process.
    public func attest(_ peer: PeerIdentity, pidfd: Int32?) -> Caller {
        let process = PeerProcess(pid: peer.pid, pidfd: pidfd)
        let facts = process.read(with: reader)
        let runsBridge = bridge != nil && facts?.executable?.file == bridge
        return Caller(
            peer: peer, process: process, reader: reader, connected: facts,
            bridged: runsBridge ? bridged(from: process) : nil)
    }

    /// The nearest ancestor of `process` that is not a shell, attested as carefully as a caller:
    /// its `/proc` directory is opened, and then the child asked whether that pid is still its
    /// parent (had the parent exited, the child would have a new one, and the pid might have
    /// gone to another program); reads through the directory fail once that process is gone.
    func bridged(from process: PeerProcess) -> BridgedProgram? {
        var child = process
        for _ in 0..<Self.maximumAncestors {
            guard let parentPID = child.parentPID(), parentPID > 1 else { return nil }
            let parent = PeerProcess(pid: parentPID, pidfd: nil)
            guard child.parentPID() == parentPID, let facts = parent.read(with: reader),
                let path = facts.executable?.path
            else { return nil }
            let name = path.split(separator: "/").last.map(String.init) ?? path
            if !Self.shells.contains(name) { return BridgedProgram(process: parent, facts: facts) }
            child = parent
        }
        return nil
    }

    /// brokerctl in brokerd's own directory, as installed and as built.
    public static func bridgeBesideBroker() -> FileIdentity? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        let path = String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let slash = path.lastIndex(of: "/") else { return nil }
        return FileIdentity.at(path[..<slash] + "/brokerctl")
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
