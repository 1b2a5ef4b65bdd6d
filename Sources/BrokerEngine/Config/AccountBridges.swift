import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
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
    package static let tableKeys: Set<String> = ["git", "docker"]

    /// Reads the `git` and `docker` tables of every `[accounts.NAME]` table; accounts with
    /// neither are left out.
    package static func parse(accounts: TOMLTable?, path: String) throws -> [String: AccountBridges] {
        var result: [String: AccountBridges] = [:]
        for name in accounts?.keys ?? [] {
            guard let account = accounts?[name]?.table else { continue }
            let place = "\(path): accounts.\(name)"
            var bridges = AccountBridges()
            if let value = account["git"] {
                let (hosts, username, http) = try names(
                    value, list: "hosts", place: "\(place).git", check: BridgeNames.host)
                bridges.git = GitBridge(hosts: hosts, username: username, allowHTTP: http)
            }
            if let value = account["docker"] {
                let (registries, username, http) = try names(
                    value, list: "registries", place: "\(place).docker", check: BridgeNames.registry)
                bridges.docker = DockerBridge(registries: registries, username: username, allowHTTP: http)
            }
            if bridges != AccountBridges() { result[name] = bridges }
        }
        return result
    }

    /// A table of a list `list` of names, each normalised by `check`, an optional `username`, and
    /// an optional `allow_http`: those of the names also served over plain http (`nil` for none).
    private static func names(
        _ value: TOMLValue, list: String, place: String, check: (String) -> String?
    ) throws -> (names: [String], username: String, allowHTTP: [String]?) {
        guard let table = value.table else { throw ConfigError(description: "\(place) must be a table") }
        for key in table.keys where ![list, "username", "allow_http"].contains(key) {
            throw ConfigError(description: "\(place): unknown key \(key) (known: \(list), username, allow_http)")
        }
        let what = list == "hosts" ? "hosts (like \"github.com\" or \"git.example:8443\")" : "registries"
        let names = try entries(table[list], place: "\(place).\(list)", what: what, least: 1, check: check)
        let http = try table["allow_http"].map { value in
            let listed = try entries(value, place: "\(place).allow_http", what: what, least: 0, check: check)
            guard let stray = listed.first(where: { !names.contains($0) }) else { return listed }
            throw ConfigError(description: "\(place).allow_http names \(stray), which is not one of its \(list)")
        }
        var username = BridgeNames.defaultUsername
        if let value = table["username"] {
            guard let name = value.string.flatMap(BridgeNames.username) else {
                throw ConfigError(
                    description: "\(place).username must be printable ASCII without spaces, \":\" or \"=\"")
            }
            username = name
        }
        return (names, username, http?.isEmpty == false ? http : nil)
    }

    /// An array of `least` to `BridgeNames.maximumEntries` names, each normalised by `check`.
    private static func entries(
        _ value: TOMLValue?, place: String, what: String, least: Int, check: (String) -> String?
    ) throws -> [String] {
        guard let array = value?.array, (least...BridgeNames.maximumEntries).contains(array.count) else {
            throw ConfigError(
                description: "\(place) must be an array of \(least) to \(BridgeNames.maximumEntries) \(what)")
        }
        return try array.map { item in
            guard let name = item.string.flatMap(check) else {
                throw ConfigError(description: "\(place) must be an array of \(what)")
            }
            return name
        }
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
