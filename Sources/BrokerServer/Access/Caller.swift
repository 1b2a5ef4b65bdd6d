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
    /// What `/proc` showed at accept; `nil` when the caller had exited by then, or was not read.
    private let connected: ProcessFacts?
    /// Whether `/proc` was read at accept (it is not while no rule judges programs).
    private let wasRead: Bool
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
        self.wasRead = true
    }

    /// A caller whose `/proc` was not read when it connected: no rule then judged programs. A
    /// rule that judges its program or unit refuses it, as one that cannot read them does.
    init(unreadPeer peer: PeerIdentity) {
        self.peer = peer
        self.process = nil
        self.reader = ProcFileSystemReader()
        self.connected = nil
        self.bridged = nil
        self.wasRead = false
    }

    /// A caller whose facts are known already (`nil`: it has exited), for tests of the rules.
    public init(peer: PeerIdentity, facts: ProcessFacts?, bridged: BridgedProgram? = nil) {
        self.peer = peer
        self.process = nil
        self.reader = ProcFileSystemReader()
        self.connected = facts
        self.bridged = bridged
        self.wasRead = true
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
        guard let connected else { return false }
        if let process, !process.stillRuns(connected.executable?.file, with: reader) { return false }
        return bridged?.isUnchanged(with: reader) ?? true
    }

    /// uid, pid, executable and unit, for log lines (never anything the caller sent).
    public var description: String {
        guard wasRead else { return "uid \(peer.uid) pid \(peer.pid) (connected while no rule judged programs)" }
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
        return process.stillRuns(facts.executable?.file, with: reader)
    }
}
