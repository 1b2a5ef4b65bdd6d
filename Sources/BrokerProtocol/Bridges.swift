import FoundationEssentials

/// The git hosts an account serves (`[accounts.NAME.git]`), as `status` reports them.
public struct GitBridge: Codable, Sendable, Equatable {
    /// Hosts as git names them in the credential protocol: `host` or `host:port`, lowercase.
    public var hosts: [String]
    /// The user name git is given beside the token.
    public var username: String
    /// The hosts among `hosts` also served over plain http (`allow_http`); absent when none.
    /// Other hosts get the token over https only, or http to a loopback host (docs/bridges.md).
    public var allowHTTP: [String]?

    public init(hosts: [String], username: String = BridgeNames.defaultUsername, allowHTTP: [String]? = nil) {
        self.hosts = hosts
        self.username = username
        self.allowHTTP = allowHTTP
    }

    enum CodingKeys: String, CodingKey {
        case hosts, username
        case allowHTTP = "allow_http"
    }
}

/// The container registries an account serves (`[accounts.NAME.docker]`), as `status` reports them.
public struct DockerBridge: Codable, Sendable, Equatable {
    /// Registries in the form `BridgeNames.registry(_:)` gives.
    public var registries: [String]
    /// The user name docker is given beside the token.
    public var username: String
    /// The registries among `registries` also served to an `http://` server URL (`allow_http`);
    /// absent when none.
    public var allowHTTP: [String]?

    public init(registries: [String], username: String = BridgeNames.defaultUsername, allowHTTP: [String]? = nil) {
        self.registries = registries
        self.username = username
        self.allowHTTP = allowHTTP
    }

    enum CodingKeys: String, CodingKey {
        case registries, username
        case allowHTTP = "allow_http"
    }

    /// Seconds after a refresh during which `erase` leaves the new token alone: long enough for
    /// the four erases of one `docker logout` on a loaded machine (at 5 s, one CI run saw two).
    public static let freshTokenAge: TimeInterval = 30

    /// Whether `erase` at `now` has the broker reject a token last refreshed at `refreshedAt`:
    /// `docker logout` erases up to four spellings of one registry, one after another, and a
    /// token refreshed moments ago was refused by no one.
    public static func erasesToken(refreshedAt: Date?, now: Date) -> Bool {
        guard let refreshedAt else { return true }
        return now.timeIntervalSince(refreshedAt) >= freshTokenAge
    }
}

/// How the names in bridge settings are checked and compared, the same in the broker (reading
/// `broker.toml`) and in the helpers (matching what git and docker send).
public enum BridgeNames {
    /// The user name sent beside a token when the config names none (what GitLab, Gitea and
    /// Google's registries accept for an OAuth token).
    public static let defaultUsername = "oauth2"
    /// Longest host, registry or user name accepted, in bytes.
    public static let maximumLength = 255
    /// Most hosts or registries one account may list.
    public static let maximumEntries = 64

    /// `text` as a git host (`github.com`, `git.example:8443`, `[::1]:8080`), lowercase; `nil`
    /// when it holds a scheme, a path, a user, spaces or control characters, or is too long.
    public static func host(_ text: String) -> String? {
        guard (1...maximumLength).contains(text.utf8.count), text.utf8.allSatisfy(isHostByte) else { return nil }
        return text.lowercased()
    }

    /// `text` as docker names a registry to its credential helpers, compared without what
    /// varies between its callers: an `https://` or `http://` prefix, trailing slashes and the
    /// case of the host. `https://index.docker.io/v1/` gives `index.docker.io/v1`, `GHCR.io`
    /// gives `ghcr.io`. `nil` for anything that is not a host with an optional path.
    public static func registry(_ text: String) -> String? {
        guard text.utf8.count <= maximumLength + 8 else { return nil }
        var rest = Substring(text)
        if let scheme = ["https://", "http://"].first(where: { rest.lowercased().hasPrefix($0) }) {
            rest = rest.dropFirst(scheme.count)
        }
        while rest.hasSuffix("/") { rest = rest.dropLast() }
        let slash = rest.firstIndex(of: "/") ?? rest.endIndex
        guard let host = host(String(rest[..<slash])) else { return nil }
        let path = rest[slash...]
        guard path.utf8.count <= maximumLength, !path.contains("//"),
            path.utf8.allSatisfy({ isHostByte($0) || $0 == UInt8(ascii: "/") })
        else { return nil }
        return host + path
    }

    /// `text` as a user name: printable ASCII without spaces, `:` or `=`, 1 to 255 bytes.
    public static func username(_ text: String) -> String? {
        guard (1...maximumLength).contains(text.utf8.count),
            text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: ":") && $0 != UInt8(ascii: "=") })
        else { return nil }
        return text
    }

    /// Letters, digits, `.`, `-`, `_`, and `:`, `[`, `]` for a port or an IPv6 address.
    private static func isHostByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return Array(".-_:[]".utf8).contains(byte)
        }
    }
}
