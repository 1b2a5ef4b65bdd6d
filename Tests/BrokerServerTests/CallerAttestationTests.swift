import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
@testable import BrokerServer
import BrokerVault
import Foundation
import Logging
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Attesting a real connecting process, including one that exits while it is read (the pid
/// reuse case, with an injected `/proc` reader), and the rules a caller is judged by.
@Suite struct CallerAttestationTests {
    /// A listening socket and a brokerctl connected to it, waiting for an answer that never comes.
    final class ConnectedPeer: Sendable {
        let directory: TemporaryDirectory
        let listener: Int32
        let connection: Int32
        let child: ChildProcess
        let brokerctl = BrokerProcess.binary("brokerctl").path

        /// brokerctl started by this process, or through `/bin/sh -c` when `throughShell`.
        init(throughShell: Bool = false) throws {
            directory = try TemporaryDirectory()
            let path = directory.file("s.sock")
            let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            self.listener = listener
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                for (index, byte) in path.utf8.enumerated() { raw[index] = byte }
            }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
            var wait = timeval(tv_sec: 20, tv_usec: 0)
            setsockopt(listener, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
            guard bound == 0, listen(listener, 4) == 0,
                let child = try? ChildProcess.spawn(
                    throughShell ? "/bin/sh" : brokerctl,
                    // "; exit": the shell stays brokerctl's parent instead of exec'ing it.
                    throughShell
                        ? ["-c", "'\(brokerctl)' status --socket '\(path)'; exit $?"] : ["status", "--socket", path],
                    environment: [:])
            else {
                close(listener)
                throw HarnessError("cannot listen on \(path) or start brokerctl")
            }
            self.child = child
            connection = accept(listener, nil, nil)
            guard connection >= 0 else { throw HarnessError("brokerctl did not connect") }
        }

        deinit {
            if !child.hasExited() { kill(child.pid, SIGKILL) }
            child.wait()
            close(connection)
            close(listener)
            directory.remove()
        }

        /// The peer's credentials and its pidfd, as the server reads them.
        func credentials() throws -> (PeerIdentity, Int32) {
            var credentials = Credentials()
            var length = socklen_t(MemoryLayout<Credentials>.size)
            guard getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 else {
                throw HarnessError("no SO_PEERCRED")
            }
            var pidfd: Int32 = -1
            length = socklen_t(MemoryLayout<Int32>.size)
            guard getsockopt(connection, SOL_SOCKET, CallerAttestor.peerPIDFDOption, &pidfd, &length) == 0 else {
                throw HarnessError("no SO_PEERPIDFD (Linux 6.5 or later)")
            }
            return (PeerIdentity(pid: credentials.pid, uid: credentials.uid, gid: credentials.gid), pidfd)
        }

        /// Ends brokerctl and reaps it, so its pid is free for the next process.
        func killAndReap() {
            kill(child.pid, SIGKILL)
            child.wait()
        }
    }

    /// `struct ucred`, which the C library declares only under `_GNU_SOURCE`.
    struct Credentials {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
    }

    /// Stands for `/proc` read after the caller's pid went to another program: the caller is
    /// made to exit (and reaped) first, and the facts returned are the other program's.
    struct ReusedPIDReader: ProcessReader {
        let exitCaller: @Sendable () -> Void
        let otherProgram: ProcessFacts

        func facts(of process: ProcessDirectory) -> ProcessFacts {
            exitCaller()
            return otherProgram
        }
    }

    static let allowedProgram = ProcessFacts(
        executable: Executable(path: "/usr/bin/allowed", file: FileIdentity(device: 1, inode: 2)),
        unit: "allowed.service")

    @Test func theConnectingProgramIsAttested() throws {
        let peer = try ConnectedPeer()
        let (identity, pidfd) = try peer.credentials()
        #expect(identity.pid == peer.child.pid)
        let caller = CallerAttestor().attest(identity, pidfd: pidfd)
        let facts = try #require(caller.facts())
        #expect(facts.executable?.file == FileIdentity.at(peer.brokerctl))
        let ownCgroup = try String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)
        #expect(facts.unit == SystemdUnit.unit(fromCgroupFile: ownCgroup))
        #expect(caller.description.contains("pid \(peer.child.pid)"))
    }

    @Test func theBridgeIsJudgedWithTheProgramItWorksForPastShells() throws {
        let ownExecutable = try #require(FileIdentity.at("/proc/self/exe"))
        for throughShell in [false, true] {
            let peer = try ConnectedPeer(throughShell: throughShell)
            let (identity, pidfd) = try peer.credentials()
            let bridge = FileIdentity.at(peer.brokerctl)
            let caller = CallerAttestor(bridge: bridge).attest(identity, pidfd: pidfd)
            #expect(caller.facts()?.executable?.file == bridge)
            #expect(caller.bridged?.facts.executable?.file == ownExecutable, "through a shell: \(throughShell)")
            #expect(caller.isUnchanged())
            #expect(caller.description.contains("for pid \(getpid())"))
            // A caller that is not the bridge program is judged alone.
            let (_, otherPidfd) = try peer.credentials()
            #expect(CallerAttestor(bridge: ownExecutable).attest(identity, pidfd: otherPidfd).bridged == nil)
        }
    }

    @Test func theProgramABridgeWorksForMustBeListed() {
        let rules = AccessRules(accounts: ["api": AccountAccess(executables: ["/usr/bin/env"])])
        let listed = BridgedProgram(
            facts: ProcessFacts(
                executable: Executable(path: "/usr/bin/env", file: FileIdentity.at("/usr/bin/env")!), unit: nil))
        let unlisted = BridgedProgram(
            facts: ProcessFacts(executable: Executable(path: "/bin/sh", file: FileIdentity.at("/bin/sh")!), unit: nil))
        let bridge = ProcessFacts(
            executable: Executable(path: "/bin/true", file: FileIdentity.at("/bin/true")!), unit: nil)
        let peer = PeerIdentity(pid: 42, uid: owner, gid: owner)
        #expect(policy().mayUse("api", caller: Caller(peer: peer, facts: bridge, bridged: listed), rules: rules))
        #expect(!policy().mayUse("api", caller: Caller(peer: peer, facts: bridge, bridged: unlisted), rules: rules))
        #expect(!policy().mayUse("api", caller: Caller(peer: peer, facts: bridge), rules: rules))
    }

    @Test func aCallerWhosePIDWasReusedDuringTheReadsIsRefused() throws {
        // Control: the same facts from a caller that is still running are taken.
        let running = try ConnectedPeer()
        let (runningIdentity, runningPidfd) = try running.credentials()
        let unchanged = ReusedPIDReader(exitCaller: {}, otherProgram: Self.allowedProgram)
        let caller = CallerAttestor(reader: unchanged).attest(runningIdentity, pidfd: runningPidfd)
        #expect(caller.facts() == Self.allowedProgram)

        let peer = try ConnectedPeer()
        let (identity, pidfd) = try peer.credentials()
        let reused = ReusedPIDReader(exitCaller: { peer.killAndReap() }, otherProgram: Self.allowedProgram)
        let exited = CallerAttestor(reader: reused).attest(identity, pidfd: pidfd)
        #expect(exited.facts() == nil, "a caller that exited during the reads inherited another program's facts")
        let rules = AccessRules(accounts: ["api": AccountAccess(executables: ["/usr/bin/allowed"])])
        let policy = AccessPolicy(ownerUID: identity.uid, logger: Logger(label: "test"))
        #expect(!policy.mayUse("api", caller: exited, rules: rules))
    }

    @Test func aCallerIsReadAgainBeforeAnOwnerOperationAndShowsNothingOnceExited() throws {
        let peer = try ConnectedPeer()
        let (identity, pidfd) = try peer.credentials()
        let caller = CallerAttestor().attest(identity, pidfd: pidfd)
        let tool = peer.brokerctl
        let policy = AccessPolicy(ownerUID: identity.uid, logger: Logger(label: "test"))
        let rules = AccessRules(admins: [tool])
        #expect(caller.currentFacts() == caller.facts())
        #expect(policy.isAdmin(caller, rules: rules))
        peer.killAndReap()
        #expect(caller.currentFacts() == nil)
        #expect(caller.facts() != nil, "the facts read at accept stay the connection's")
        #expect(!caller.isUnchanged())
        #expect(!policy.isAdmin(caller, rules: rules))
    }

    // MARK: Rules

    let owner: UInt32 = 1000

    func policy() -> AccessPolicy { AccessPolicy(ownerUID: owner, logger: Logger(label: "test")) }

    func caller(uid: UInt32, running path: String?, unit: String? = nil) -> Caller {
        let executable = path.map { Executable(path: $0, file: FileIdentity.at($0)!) }
        return Caller(
            peer: PeerIdentity(pid: 42, uid: uid, gid: uid), facts: ProcessFacts(executable: executable, unit: unit))
    }

    @Test func aCallerThatExitedMatchesNoProgramRule() {
        let rules = AccessRules(accounts: ["api": AccountAccess(units: ["ci.service"]), "any": AccountAccess()])
        let gone = Caller(peer: PeerIdentity(pid: 42, uid: owner, gid: owner), facts: nil)
        #expect(!policy().mayUse("api", caller: gone, rules: rules))
        #expect(policy().mayUse("any", caller: gone, rules: rules))
    }

    @Test func withoutARuleOnlyTheOwnersUIDIsServed() {
        let rules = AccessRules()
        #expect(policy().mayUse("api", caller: caller(uid: owner, running: nil), rules: rules))
        #expect(!policy().mayUse("api", caller: caller(uid: 0, running: nil), rules: rules))
        #expect(!policy().mayUse("api", caller: caller(uid: 1001, running: nil), rules: rules))
    }

    @Test func executablesMatchTheFileNowAtTheListedPath() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let listed = directory.file("tool")
        let copy = directory.file("tool-copy")
        let link = directory.file("tool-link")
        #expect(FileManager.default.createFile(atPath: listed, contents: Data("#!/bin/sh\n".utf8)))
        try FileManager.default.copyItem(atPath: listed, toPath: copy)
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: listed)
        let rules = AccessRules(accounts: ["api": AccountAccess(executables: [link], uids: [1001])])

        #expect(policy().mayUse("api", caller: caller(uid: owner, running: listed), rules: rules))
        #expect(policy().mayUse("api", caller: caller(uid: 1001, running: listed), rules: rules))
        // The same bytes at another path are another file.
        #expect(!policy().mayUse("api", caller: caller(uid: owner, running: copy), rules: rules))
        // Root is not exempt, and an executable that could not be read matches nothing.
        #expect(!policy().mayUse("api", caller: caller(uid: 0, running: listed), rules: rules))
        #expect(!policy().mayUse("api", caller: caller(uid: owner, running: nil), rules: rules))
        #expect(!policy().mayUse("api", caller: caller(uid: 1002, running: listed), rules: rules))
        // A file replaced at the listed path: programs started from the old one no longer match.
        let running = caller(uid: owner, running: listed)
        // (The old file stays, as a running program holds it, so its inode is not reused.)
        try FileManager.default.moveItem(atPath: listed, toPath: directory.file("tool-old"))
        try FileManager.default.copyItem(atPath: copy, toPath: listed)
        #expect(!policy().mayUse("api", caller: running, rules: rules))
    }

    @Test func unitsOrExecutablesMayAdmit() throws {
        let rules = AccessRules(
            accounts: ["ci": AccountAccess(executables: ["/nonexistent/tool"], units: ["ci-runner.service"])])
        #expect(
            policy().mayUse("ci", caller: caller(uid: owner, running: nil, unit: "ci-runner.service"), rules: rules))
        #expect(!policy().mayUse("ci", caller: caller(uid: owner, running: nil, unit: "other.service"), rules: rules))
        #expect(!policy().mayUse("ci", caller: caller(uid: owner, running: nil, unit: nil), rules: rules))
        #expect(
            !policy().mayUse("ci", caller: caller(uid: 1001, running: nil, unit: "ci-runner.service"), rules: rules))
    }

    @Test func adminsNarrowTheOwnerOperations() throws {
        let tool = BrokerProcess.binary("brokerctl").path
        #expect(policy().isAdmin(caller(uid: owner, running: nil), rules: AccessRules()))
        #expect(!policy().isAdmin(caller(uid: 0, running: nil), rules: AccessRules()))
        let rules = AccessRules(admins: [tool])
        #expect(policy().isAdmin(caller(uid: owner, running: tool), rules: rules))
        #expect(!policy().isAdmin(caller(uid: owner, running: "/proc/self/exe"), rules: rules))
        #expect(!policy().isAdmin(caller(uid: owner, running: nil), rules: rules))
        #expect(!policy().isAdmin(caller(uid: 1001, running: tool), rules: rules))
    }

    @Test func onlyListedUIDsBesideTheOwnerAndRootConnect() {
        let rules = AccessRulesStore(AccessRules(accounts: ["shared": AccountAccess(uids: [1001])]))
        let policy = AccessPolicy(ownerUID: owner, rules: rules, logger: Logger(label: "test"))
        #expect(policy.mayConnect(PeerIdentity(pid: 1, uid: owner, gid: 0)))
        #expect(policy.mayConnect(PeerIdentity(pid: 1, uid: 0, gid: 0)))
        #expect(policy.mayConnect(PeerIdentity(pid: 1, uid: 1001, gid: 0)))
        #expect(!policy.mayConnect(PeerIdentity(pid: 1, uid: 1002, gid: 0)))
        rules.replace(with: AccessRules())
        #expect(!policy.mayConnect(PeerIdentity(pid: 1, uid: 1001, gid: 0)))
    }

    @Test func aConnectionsMemoFollowsAReload() {
        let rules = AccessRulesStore(AccessRules(accounts: ["api": AccountAccess(uids: [1001])]))
        let policy = AccessPolicy(ownerUID: owner, rules: rules, logger: Logger(label: "test"))
        var access = CallerAccess(policy: policy, caller: caller(uid: 1001, running: nil))
        let before = (api: access.mayUse("api"), other: access.mayUse("other"))
        #expect(before.api && !before.other)
        rules.replace(with: AccessRules(accounts: ["other": AccountAccess(uids: [1001])]))
        let after = (api: access.mayUse("api"), other: access.mayUse("other"))
        #expect(!after.api && after.other)
    }
}
