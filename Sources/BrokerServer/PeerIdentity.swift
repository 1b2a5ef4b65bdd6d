import BrokerCore
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Who is on the other end of a connection, from `SO_PEERCRED` (kernel-attested).
public struct PeerIdentity: Sendable, Equatable, CustomStringConvertible {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32

    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }

    public var description: String { "pid \(pid) uid \(uid)" }
}

/// Who may connect, which accounts a caller may use and who may run the owner operations
/// (CONTRACT section 5), under the rules in force (`[accounts.NAME.access]`, `[broker] admins`).
public struct AccessPolicy: Sendable {
    /// The broker's own uid: the owner.
    public var ownerUID: UInt32
    /// The rules in force, replaced by a config reload.
    public let rules: AccessRulesStore
    /// How callers are attested when they connect.
    public let attestor: CallerAttestor
    /// Notes refused callers, throttled.
    let refusals: LimitLog

    public init(
        ownerUID: UInt32 = getuid(), rules: AccessRulesStore = AccessRulesStore(),
        attestor: CallerAttestor = CallerAttestor(), logger: Logger
    ) {
        self.ownerUID = ownerUID
        self.rules = rules
        self.attestor = attestor
        self.refusals = LimitLog(logger: logger)
    }

    /// The owner, root and the uids some account lists may connect; what they may use is
    /// decided per account.
    public func mayConnect(_ peer: PeerIdentity) -> Bool {
        peer.uid == ownerUID || peer.uid == 0 || rules.current.listedUIDs.contains(peer.uid)
    }

    /// Whether `caller` may use `account` under `rules`. Without a rule, only the owner's uid
    /// may; with one, the owner's uid or a listed one, and a listed executable or unit when the
    /// rule names any (root is not exempt). What could not be read matches nothing.
    public func mayUse(_ account: String, caller: Caller, rules: AccessRules) -> Bool {
        guard let access = rules.accounts[account] else { return caller.peer.uid == ownerUID }
        guard caller.peer.uid == ownerUID || access.uids.contains(caller.peer.uid) else { return false }
        guard access.namesPrograms else { return true }
        guard let facts = caller.facts() else { return false }
        return runsListed(access.executables, facts) || facts.unit.map(access.units.contains) == true
    }

    /// Whether `caller` may run the owner operations: the owner's uid, and one of the
    /// executables `[broker] admins` lists when it lists any, as `/proc` shows it now.
    public func isAdmin(_ caller: Caller, rules: AccessRules) -> Bool {
        guard caller.peer.uid == ownerUID else { return false }
        guard !rules.admins.isEmpty else { return true }
        return caller.currentFacts().map { runsListed(rules.admins, $0) } ?? false
    }

    /// Whether the process runs the file now at one of `paths` (an older file that was
    /// replaced at that path since the process started does not count).
    private func runsListed(_ paths: [String], _ facts: ProcessFacts) -> Bool {
        guard let running = facts.executable?.file else { return false }
        return paths.contains { FileIdentity.at($0) == running }
    }

    /// Logs that `caller` was refused `what` (an account or an operation), at most once every
    /// ten seconds for the same uid, executable and unit.
    func noteRefusal(of caller: Caller, _ what: String) {
        let facts = caller.facts()
        let program = "\(caller.peer.uid) \(facts?.executable?.path ?? "") \(facts?.unit ?? "")"
        refusals.notice("refused a caller", key: program, metadata: ["caller": "\(caller)", "refused": "\(what)"])
    }
}
