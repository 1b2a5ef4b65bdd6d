import Foundation

/// The default locations of CONTRACT section 2, each overridable by an environment variable.
public struct DefaultPaths: Sendable {
    public var environment: [String: String]

    public init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.environment = environment
    }

    /// `$TOKENBROKER_SOCKET`, else `$XDG_RUNTIME_DIR/tokenbroker/broker.sock`
    /// (falling back to `/run/user/UID`, then `/tmp/tokenbroker-UID` when there is no runtime dir).
    public var socket: String {
        if let path = nonEmpty("TOKENBROKER_SOCKET") { return path }
        let runtime = nonEmpty("XDG_RUNTIME_DIR") ?? Self.fallbackRuntimeDirectory()
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
            ?? (nonEmpty("STATE_DIRECTORY") ?? (nonEmpty("XDG_STATE_HOME") ?? home + "/.local/state") + "/tokenbroker")
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

    private var home: String { nonEmpty("HOME") ?? NSHomeDirectory() }
    private var configHome: String { nonEmpty("XDG_CONFIG_HOME") ?? home + "/.config" }

    private func nonEmpty(_ name: String) -> String? {
        guard let value = environment[name], !value.isEmpty else { return nil }
        return value
    }

    private static func fallbackRuntimeDirectory() -> String {
        let uid = getuid()
        let systemDirectory = "/run/user/\(uid)"
        return FileManager.default.fileExists(atPath: systemDirectory) ? systemDirectory : "/tmp/tokenbroker-\(uid)"
    }
}
