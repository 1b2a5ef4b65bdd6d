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
    /// a caller that exited before that may leave its pid to another process. With `reading`
    /// false (no rule in force judges programs), `/proc` is not read: the caller is known by its
    /// credentials alone, and a rule a reload adds later refuses it (docs/security.md).
    public func attest(_ peer: PeerIdentity, pidfd: Int32?, reading: Bool = true) -> Caller {
        guard reading else {
            if let pidfd { close(pidfd) }
            return Caller(unreadPeer: peer)
        }
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
