import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// The default locations of docs/install.md ("Files"), each overridable by an environment variable.
public struct DefaultPaths: Sendable {
    /// The value of each `Variable`, in `Variable.allCases` order. An array, not a dictionary:
    /// a dictionary's first use looks up `String: Hashable` among every conformance of the
    /// binary, which cost `brokerctl token` a tenth of its CPU.
    private var values: [String?]

    public init(environment: [String: String]) {
        values = Variable.allCases.map { environment[$0.rawValue] }
    }

    /// The paths this process's environment gives: only the variables read here are copied
    /// (building the whole environment was a tenth of a `brokerctl token` call).
    public init() {
        values = Variable.allCases.map { variable in getenv(variable.rawValue).map { String(cString: $0) } }
    }

    /// These paths without `$TOKENBROKER_SOCKET`: where the broker's own socket is.
    public var ignoringSocketVariable: DefaultPaths {
        var paths = self
        paths.values[Variable.socket.index] = nil
        return paths
    }

    /// Every environment variable these paths depend on.
    enum Variable: String, CaseIterable {
        case socket = "TOKENBROKER_SOCKET", config = "TOKENBROKER_CONFIG", vault = "TOKENBROKER_VAULT"
        case keyFile = "TOKENBROKER_KEY_FILE", runtimeDirectory = "XDG_RUNTIME_DIR"
        case configHome = "XDG_CONFIG_HOME", stateHome = "XDG_STATE_HOME", home = "HOME"
        case stateDirectory = "STATE_DIRECTORY", configurationDirectory = "CONFIGURATION_DIRECTORY"
        case credentialsDirectory = "CREDENTIALS_DIRECTORY"

        var index: Int { Self.allCases.firstIndex(of: self) ?? 0 }
    }

    /// `$TOKENBROKER_SOCKET`, else `$XDG_RUNTIME_DIR/tokenbroker/broker.sock`. Without a
    /// runtime dir: logind's `/run/user/UID` when it exists, else `tokenbroker/broker.sock` in
    /// the user's own state directory (`$XDG_STATE_HOME`, `~/.local/state`), as gpg-agent falls
    /// back to `~/.gnupg`: never a name under a shared directory such as /tmp, which another
    /// user could create first.
    public var socket: String {
        if let path = nonEmpty(.socket) { return path }
        let runtime = nonEmpty(.runtimeDirectory) ?? Self.loginRuntimeDirectory() ?? stateHome
        return runtime + "/tokenbroker/broker.sock"
    }

    /// Why `socket` is a fallback, for a message about it: `XDG_RUNTIME_DIR` is unset and no
    /// `TOKENBROKER_SOCKET` names it; `nil` when a variable gave the path.
    public var socketFallback: String? {
        guard nonEmpty(.socket) == nil, nonEmpty(.runtimeDirectory) == nil else { return nil }
        let place =
            Self.loginRuntimeDirectory() != nil
            ? "logind's runtime directory" : "the state directory ($XDG_STATE_HOME, else ~/.local/state)"
        return "XDG_RUNTIME_DIR is unset, so that path is the fallback in \(place); if the broker listens "
            + "elsewhere, set XDG_RUNTIME_DIR or TOKENBROKER_SOCKET, or give --socket"
    }

    /// The WLCG bearer token discovery file, `$XDG_RUNTIME_DIR/bt_u$UID` (logind's
    /// `/run/user/UID` without a runtime dir); `nil` without either, never a name under /tmp.
    public var wlcgBearerTokenFile: String? {
        runtimeDirectory.map { $0 + "/bt_u\(getuid())" }
    }

    /// `$XDG_RUNTIME_DIR`, else logind's `/run/user/UID` when it exists; `nil` without either.
    public var runtimeDirectory: String? {
        nonEmpty(.runtimeDirectory) ?? Self.loginRuntimeDirectory()
    }

    /// `$TOKENBROKER_CONFIG`, else `broker.toml` in systemd's `$CONFIGURATION_DIRECTORY` or
    /// in `$XDG_CONFIG_HOME/tokenbroker`.
    public var config: String {
        nonEmpty(.config) ?? configDirectory + "/broker.toml"
    }

    /// `$TOKENBROKER_VAULT`, else `vault` in systemd's `$STATE_DIRECTORY` or in
    /// `$XDG_STATE_HOME/tokenbroker`.
    public var vault: String {
        nonEmpty(.vault)
            ?? (nonEmpty(.stateDirectory) ?? stateHome + "/tokenbroker")
            + "/vault"
    }

    /// `$TOKENBROKER_KEY_FILE`, else systemd's `$CREDENTIALS_DIRECTORY/vault-key`, else
    /// `vault.key` beside the config file.
    public var keyFile: (path: String, fromSystemd: Bool) {
        if let path = nonEmpty(.keyFile) { return (path, false) }
        if let directory = nonEmpty(.credentialsDirectory) { return (directory + "/vault-key", true) }
        return (configDirectory + "/vault.key", false)
    }

    private var configDirectory: String { nonEmpty(.configurationDirectory) ?? configHome + "/tokenbroker" }

    private var home: String { nonEmpty(.home) ?? FileManager.default.homeDirectoryForCurrentUser.path }
    private var configHome: String { nonEmpty(.configHome) ?? home + "/.config" }
    private var stateHome: String { nonEmpty(.stateHome) ?? home + "/.local/state" }

    private func nonEmpty(_ variable: Variable) -> String? {
        guard let value = values[variable.index], !value.isEmpty else { return nil }
        return value
    }

    /// `/run/user/UID`, which logind creates for the user under a root-owned `/run/user`, when it exists.
    private static func loginRuntimeDirectory() -> String? {
        let directory = "/run/user/\(getuid())"
        return FileManager.default.fileExists(atPath: directory) ? directory : nil
    }
}
