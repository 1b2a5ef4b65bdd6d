import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// The default locations of CONTRACT section 2, each overridable by an environment variable.
public struct DefaultPaths: Sendable {
    public var environment: [String: String]

    public init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.environment = environment
    }

    /// `$TOKENBROKER_SOCKET`, else `$XDG_RUNTIME_DIR/tokenbroker/broker.sock`. Without a
    /// runtime dir: logind's `/run/user/UID` when it exists, else `tokenbroker/broker.sock` in
    /// the user's own state directory (`$XDG_STATE_HOME`, `~/.local/state`), as gpg-agent falls
    /// back to `~/.gnupg`: never a name under a shared directory such as /tmp, which another
    /// user could create first.
    public var socket: String {
        if let path = nonEmpty("TOKENBROKER_SOCKET") { return path }
        let runtime = nonEmpty("XDG_RUNTIME_DIR") ?? Self.loginRuntimeDirectory() ?? stateHome
        return runtime + "/tokenbroker/broker.sock"
    }

    /// `$TOKENBROKER_CONFIG`, else `broker.toml` in systemd's `$CONFIGURATION_DIRECTORY` or
    /// in `$XDG_CONFIG_HOME/tokenbroker`.
    public var config: String {
        nonEmpty("TOKENBROKER_CONFIG") ?? configDirectory + "/broker.toml"
    }

    /// `$TOKENBROKER_VAULT`, else `vault` in systemd's `$STATE_DIRECTORY` or in
    /// `$XDG_STATE_HOME/tokenbroker`.
    public var vault: String {
        nonEmpty("TOKENBROKER_VAULT")
            ?? (nonEmpty("STATE_DIRECTORY") ?? stateHome + "/tokenbroker")
            + "/vault"
    }

    /// `$TOKENBROKER_KEY_FILE`, else systemd's `$CREDENTIALS_DIRECTORY/vault-key`, else
    /// `vault.key` beside the config file.
    public var keyFile: (path: String, fromSystemd: Bool) {
        if let path = nonEmpty("TOKENBROKER_KEY_FILE") { return (path, false) }
        if let directory = nonEmpty("CREDENTIALS_DIRECTORY") { return (directory + "/vault-key", true) }
        return (configDirectory + "/vault.key", false)
    }

    private var configDirectory: String { nonEmpty("CONFIGURATION_DIRECTORY") ?? configHome + "/tokenbroker" }

    private var home: String { nonEmpty("HOME") ?? FileManager.default.homeDirectoryForCurrentUser.path }
    private var configHome: String { nonEmpty("XDG_CONFIG_HOME") ?? home + "/.config" }
    private var stateHome: String { nonEmpty("XDG_STATE_HOME") ?? home + "/.local/state" }

    private func nonEmpty(_ name: String) -> String? {
        guard let value = environment[name], !value.isEmpty else { return nil }
        return value
    }

    /// `/run/user/UID`, which logind creates for the user under a root-owned `/run/user`, when it exists.
    private static func loginRuntimeDirectory() -> String? {
        let directory = "/run/user/\(getuid())"
        return FileManager.default.fileExists(atPath: directory) ? directory : nil
    }
}
