import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Who may connect, which accounts a caller may use and who may run the owner operations
/// under the rules in force (`[accounts.NAME.access]`, `[broker] admins`).
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

    /// Whether `caller` may use `account` under `rules`, by what it was when it connected.
    /// Without a rule, only the owner's uid may; with one, the owner's uid or a listed one, and
    /// a listed executable or unit when the rule names any (root is not exempt). A caller that
    /// runs the bridge program is also judged by the program it works for. What could not be
    /// read matches nothing. A rule that names programs holds a caller only while it
    /// `isUnchanged`: a process that exec'ed another program since it connected is refused.
    public func mayUse(_ account: String, caller: Caller, rules: AccessRules) -> Bool {
        guard let access = rules.accounts[account] else { return caller.peer.uid == ownerUID }
        guard caller.peer.uid == ownerUID || access.uids.contains(caller.peer.uid) else { return false }
        guard access.namesPrograms else { return true }
        guard let facts = caller.facts() else { return false }
        let listed = access.admits(facts) || caller.bridged.map { access.admits($0.facts) } == true
        return listed && caller.isUnchanged()
    }

    /// Whether `caller` may run the owner operations: the owner's uid, and one of the
    /// executables `[broker] admins` lists when it lists any, both when it connected and now.
    public func isAdmin(_ caller: Caller, rules: AccessRules) -> Bool {
        guard caller.peer.uid == ownerUID else { return false }
        guard !rules.admins.isEmpty else { return true }
        guard let connected = caller.facts(), let current = caller.currentFacts() else { return false }
        return AccountAccess.runsListed(rules.admins, connected) && AccountAccess.runsListed(rules.admins, current)
    }

    /// Logs that `caller` was refused `what` (an account or an operation), at most once every
    /// ten seconds for the same uid, executable and unit.
    func noteRefusal(of caller: Caller, _ what: String, because reason: String? = nil) {
        let facts = caller.facts()
        let program = "\(caller.peer.uid) \(facts?.executable?.path ?? "") \(facts?.unit ?? "")"
        var metadata: Logger.Metadata = ["caller": "\(caller)", "refused": "\(what)"]
        if let reason { metadata["reason"] = "\(reason)" }
        refusals.notice("refused a caller", key: program, metadata: metadata)
    }
}

extension AccountAccess {
    /// Whether a process with `facts` runs a listed executable or lives in a listed unit.
    func admits(_ facts: ProcessFacts) -> Bool {
        Self.runsListed(executables, facts) || facts.unit.map(units.contains) == true
    }

    /// Whether the process runs the file now at one of `paths` (an older file that was
    /// replaced at that path since the process started does not count).
    static func runsListed(_ paths: [String], _ facts: ProcessFacts) -> Bool {
        guard let running = facts.executable?.file else { return false }
        return paths.contains { FileIdentity.at($0) == running }
    }
}
