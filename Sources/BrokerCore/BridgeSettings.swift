import BrokerProtocol
import FoundationEssentials
import Synchronization

/// Where one account's token is offered to git and docker (`[accounts.NAME.git]`,
/// `[accounts.NAME.docker]`). The broker only reports these in `status`; the helpers in
/// brokerctl match them against what git and docker ask for.
public struct AccountBridges: Sendable, Equatable {
    public var git: GitBridge?
    public var docker: DockerBridge?

    public init(git: GitBridge? = nil, docker: DockerBridge? = nil) {
        self.git = git
        self.docker = docker
    }

    /// The keys of an `[accounts.NAME]` table these settings own.
    static let tableKeys: Set<String> = ["git", "docker"]

    /// Reads the `git` and `docker` tables of every `[accounts.NAME]` table; accounts with
    /// neither are left out.
    static func parse(accounts: TOMLTable?, path: String) throws -> [String: AccountBridges] {
        var result: [String: AccountBridges] = [:]
        for name in accounts?.keys ?? [] {
            guard let account = accounts?[name]?.table else { continue }
            let place = "\(path): accounts.\(name)"
            var bridges = AccountBridges()
            if let value = account["git"] {
                let (hosts, username) = try names(value, list: "hosts", place: "\(place).git", check: BridgeNames.host)
                bridges.git = GitBridge(hosts: hosts, username: username)
            }
            if let value = account["docker"] {
                let (registries, username) = try names(
                    value, list: "registries", place: "\(place).docker", check: BridgeNames.registry)
                bridges.docker = DockerBridge(registries: registries, username: username)
            }
            if bridges != AccountBridges() { result[name] = bridges }
        }
        return result
    }

    /// A table of a list `list` of names, each normalised by `check`, and an optional `username`.
    private static func names(
        _ value: TOMLValue, list: String, place: String, check: (String) -> String?
    ) throws -> (names: [String], username: String) {
        guard let table = value.table else { throw ConfigError(description: "\(place) must be a table") }
        for key in table.keys where key != list && key != "username" {
            throw ConfigError(description: "\(place): unknown key \(key) (known: \(list), username)")
        }
        let what = list == "hosts" ? "hosts (like \"github.com\" or \"git.example:8443\")" : "registries"
        guard let array = table[list]?.array, (1...BridgeNames.maximumEntries).contains(array.count) else {
            throw ConfigError(
                description: "\(place).\(list) must be an array of 1 to \(BridgeNames.maximumEntries) \(what)")
        }
        let names = try array.map { item in
            guard let name = item.string.flatMap(check) else {
                throw ConfigError(description: "\(place).\(list) must be an array of \(what)")
            }
            return name
        }
        var username = BridgeNames.defaultUsername
        if let value = table["username"] {
            guard let name = value.string.flatMap(BridgeNames.username) else {
                throw ConfigError(
                    description: "\(place).username must be printable ASCII without spaces, \":\" or \"=\"")
            }
            username = name
        }
        return (names, username)
    }
}

/// The bridge settings in force, by account name; replaced by a config reload.
public final class BridgeSettingsStore: Sendable {
    private let settings = Mutex<[String: AccountBridges]>([:])

    public init() {}

    /// The settings of `account`, if it has any.
    public func of(_ account: String) -> AccountBridges? { settings.withLock { $0[account] } }

    /// Puts `new` in force.
    public func replace(with new: [String: AccountBridges]) { settings.withLock { $0 = new } }
}
