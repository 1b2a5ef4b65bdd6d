import CSystemd

#if canImport(Glibc)
import Glibc
#endif

/// Desktop notifications through the freedesktop Notifications service
/// (`org.freedesktop.Notifications.Notify`) on the user's session bus, with libsystemd's sd-bus.
/// Each call blocks until the service answers (5 s at most): run it on a thread of its own.
public struct DesktopNotifications: Sendable {
    /// How long the service may take to answer.
    static let answerTimeout: UInt64 = 5_000_000

    /// The environment the bus is looked up in: `DBUS_SESSION_BUS_ADDRESS`, else the socket
    /// `$XDG_RUNTIME_DIR/bus`, as sd-bus does.
    private let environment: [String: String]

    public init(environment: [String: String]) {
        self.environment = environment
    }

    /// Whether the user has a session bus; without one nothing is sent (a server, a container).
    public var hasSessionBus: Bool {
        if let address = environment["DBUS_SESSION_BUS_ADDRESS"], !address.isEmpty { return true }
        guard let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty else { return false }
        var info = stat()
        return stat(runtime + "/bus", &info) == 0 && info.st_mode & S_IFMT == S_IFSOCK
    }

    /// Shows `summary` and `body`; returns 0, or the negative errno of the failure.
    public func show(summary: String, body: String) -> Int32 {
        tokenbroker_notify("tokenbroker", summary, body, -1, Self.answerTimeout)
    }
}
