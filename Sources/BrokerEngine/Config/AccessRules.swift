import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Who may get one account's token (`[accounts.NAME.access]`). A caller is served when its uid
/// is the owner's or listed in `uids` and, when `executables` or `units` is given, its
/// executable or its systemd unit is listed.
public struct AccountAccess: Sendable, Equatable {
    /// Absolute paths of the executables allowed; matched by the file now at that path.
    public var executables: [String] = []
    /// systemd units (user or system), by name: `ci-runner.service`, `session-2.scope`.
    public var units: [String] = []
    /// Other users who may get this account's token.
    public var uids: [UInt32] = []

    public init(executables: [String] = [], units: [String] = [], uids: [UInt32] = []) {
        self.executables = executables
        self.units = units
        self.uids = uids
    }

    /// Whether the rule names programs at all (otherwise the uid decides alone).
    public var namesPrograms: Bool { !executables.isEmpty || !units.isEmpty }
}

/// The access part of `broker.toml`: each account's rule, who may run the owner operations,
/// and how the socket brokerd binds itself is shared.
public struct AccessRules: Sendable, Equatable {
    /// Rules by account name; an account without one is for the owner's uid only.
    public var accounts: [String: AccountAccess] = [:]
    /// Executables allowed the owner operations (`[broker] admins`); empty: any process of the
    /// owner's uid.
    public var admins: [String] = []
    /// The group given the socket brokerd binds (`[broker] socket_group`): a name or a number.
    public var socketGroup: String?
    /// The socket's mode (`[broker] socket_mode`, "0660"-like).
    public var socketMode: UInt32 = 0o600

    public init(
        accounts: [String: AccountAccess] = [:], admins: [String] = [], socketGroup: String? = nil,
        socketMode: UInt32 = 0o600
    ) {
        self.accounts = accounts
        self.admins = admins
        self.socketGroup = socketGroup
        self.socketMode = socketMode
    }

    /// Every uid other than the owner's that some account lists: those may connect.
    public var listedUIDs: Set<UInt32> { Set(accounts.values.flatMap(\.uids)) }

    /// Whether any rule judges a caller by its program or unit (an account's executables or
    /// units, or `admins`): only then is a caller's `/proc` read when it connects.
    public var judgesPrograms: Bool { !admins.isEmpty || accounts.values.contains(where: \.namesPrograms) }

    /// Every listed executable (account rules and `admins`) that `uid` could replace: the
    /// file, a directory above it, or, for a symbolic link, the same along its target, is
    /// writable by `uid` or owned by it (an owner may change the mode). A rule naming such a
    /// path stops nothing that runs as `uid`. Root's own files are not counted: a process of
    /// root can do anything a rule would stop.
    public func replaceablePrograms(by uid: UInt32 = getuid()) -> [String] {
        let groups = Self.groups()
        let paths = Set(admins + accounts.values.flatMap(\.executables))
        return paths.sorted().filter { path in
            var resolved = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let target =
                realpath(path, &resolved) == nil
                ? nil : String(decoding: resolved.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            return ([path] + (target.map { [$0] } ?? [])).contains { candidate in
                Self.chain(of: candidate).contains { Self.isReplaceable($0, by: uid, groups: groups) }
            }
        }
    }

    /// The path and every directory above it.
    private static func chain(of path: String) -> [String] {
        var chain = [path]
        var current = Substring(path)
        while let slash = current.lastIndex(of: "/"), slash != current.startIndex {
            current = current[..<slash]
            chain.append(String(current))
        }
        return chain + ["/"]
    }

    /// Whether `uid` may change the file at `path` (not following a last symbolic link) or what
    /// it holds: it owns it, or the mode lets it write (a sticky directory only lets it replace
    /// what it owns, which is counted by that entry's owner).
    private static func isReplaceable(_ path: String, by uid: UInt32, groups: Set<gid_t>) -> Bool {
        var info = stat()
        guard lstat(path, &info) == 0 else { return false }
        if uid != 0, info.st_uid == uid { return true }
        guard info.st_mode & S_ISVTX == 0 || info.st_mode & S_IFMT != S_IFDIR else { return false }
        return info.st_mode & S_IWOTH != 0 || (info.st_mode & S_IWGRP != 0 && groups.contains(info.st_gid))
    }

    /// The broker's own groups.
    private static func groups() -> Set<gid_t> {
        var list = [gid_t](repeating: 0, count: Int(NGROUPS_MAX) + 1)
        let count = getgroups(Int32(list.count), &list)
        return Set(list.prefix(max(0, Int(count)))).union([getegid()])
    }

    /// The `[broker]` keys these rules own, beside the engine's numeric settings.
    package static let brokerKeys = ["admins", "socket_group", "socket_mode"]

    /// Longest path or unit name accepted (PATH_MAX; systemd's unit names are shorter).
    package static let maximumNameLength = 4096
    /// Most entries one list may hold.
    package static let maximumEntries = 256

    /// Reads the `[broker]` table's access keys and every `[accounts.NAME.access]` table.
    package static func parse(broker: TOMLTable?, accounts: TOMLTable?, path: String) throws -> AccessRules {
        var rules = AccessRules()
        if let broker {
            if let value = broker["admins"] {
                rules.admins = try executables(value, place: "\(path): broker.admins")
            }
            if let value = broker["socket_group"] {
                rules.socketGroup = try socketGroup(value, place: "\(path): broker.socket_group")
            }
            if let value = broker["socket_mode"] {
                rules.socketMode = try socketMode(value, place: "\(path): broker.socket_mode")
            }
        }
        for name in accounts?.keys ?? [] {
            guard let value = accounts?[name]?.table?["access"] else { continue }
            rules.accounts[name] = try access(value, place: "\(path): accounts.\(name).access")
        }
        return rules
    }

    private static func access(_ value: TOMLValue, place: String) throws -> AccountAccess {
        guard let table = value.table else { throw ConfigError(description: "\(place) must be a table") }
        var access = AccountAccess()
        for key in table.keys {
            let value = table[key]!
            switch key {
            case "executables": access.executables = try executables(value, place: "\(place).executables")
            case "units": access.units = try units(value, place: "\(place).units")
            case "uids": access.uids = try uids(value, place: "\(place).uids")
            default:
                throw ConfigError(description: "\(place): unknown key \(key) (known: executables, units, uids)")
            }
        }
        return access
    }

    /// A list of at most `maximumEntries` strings, each checked by `check`.
    private static func texts(_ value: TOMLValue, place: String, what: String, check: (String) -> Bool) throws
        -> [String]
    {
        guard let array = value.array, array.count <= maximumEntries else {
            throw ConfigError(description: "\(place) must be an array of at most \(maximumEntries) \(what)")
        }
        return try array.map { item in
            guard let text = item.string, text.utf8.count <= maximumNameLength, check(text) else {
                throw ConfigError(description: "\(place) must be an array of \(what)")
            }
            return text
        }
    }

    private static func executables(_ value: TOMLValue, place: String) throws -> [String] {
        try texts(value, place: place, what: "absolute paths") { text in
            text.hasPrefix("/") && !text.utf8.contains(0)
        }
    }

    private static func units(_ value: TOMLValue, place: String) throws -> [String] {
        try texts(value, place: place, what: "unit names (like \"ci-runner.service\")") { SystemdUnit.isUnitName($0) }
    }

    private static func uids(_ value: TOMLValue, place: String) throws -> [UInt32] {
        guard let array = value.array, array.count <= maximumEntries else {
            throw ConfigError(description: "\(place) must be an array of at most \(maximumEntries) uids")
        }
        return try array.map { item in
            // (uid_t)-1 means "no uid" to the kernel.
            guard let number = item.int, number >= 0, number < Int64(UInt32.max) else {
                throw ConfigError(description: "\(place) must be an array of uids (0 to \(UInt32.max - 1))")
            }
            return UInt32(number)
        }
    }

    private static func socketGroup(_ value: TOMLValue, place: String) throws -> String {
        guard let text = value.string, (1...256).contains(text.utf8.count),
            text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: ":") })
        else {
            throw ConfigError(description: "\(place) must be a group name or number")
        }
        return text
    }

    /// An octal mode given as text ("0660"): read and write for the owner, no execute or special
    /// bits (they mean nothing on a socket).
    private static func socketMode(_ value: TOMLValue, place: String) throws -> UInt32 {
        guard let text = value.string, (3...4).contains(text.utf8.count),
            text.utf8.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "7")).contains($0) }),
            let mode = UInt32(text, radix: 8), mode & ~0o666 == 0, mode & 0o600 == 0o600
        else {
            throw ConfigError(
                description: "\(place) must be an octal mode in quotes, like \"0660\", with read and write for the "
                    + "owner and no execute bits")
        }
        return mode
    }
}

/// The access rules in force, replaced by a config reload; a generation number lets readers
/// that keep decisions notice a change with one atomic load.
public final class AccessRulesStore: Sendable {
    private let rules: Mutex<AccessRules>
    private let changes = Atomic<Int>(0)
    private let judging: Atomic<Bool>

    public init(_ rules: AccessRules = AccessRules()) {
        self.rules = Mutex(rules)
        judging = Atomic(rules.judgesPrograms)
    }

    /// The rules now in force.
    public var current: AccessRules { rules.withLock { $0 } }

    /// Changes every time the rules are replaced.
    public var generation: Int { changes.load(ordering: .acquiring) }

    /// `AccessRules.judgesPrograms` of the rules in force, kept at each replacement so that an
    /// accepted connection pays one atomic load for it.
    public var judgesPrograms: Bool { judging.load(ordering: .acquiring) }

    /// The rules now in force with their generation.
    public func snapshot() -> (rules: AccessRules, generation: Int) {
        rules.withLock { rules in (rules, changes.load(ordering: .relaxed)) }
    }

    /// Puts `new` in force.
    public func replace(with new: AccessRules) {
        rules.withLock { rules in
            rules = new
            judging.store(new.judgesPrograms, ordering: .releasing)
            changes.add(1, ordering: .releasing)
        }
    }
}
