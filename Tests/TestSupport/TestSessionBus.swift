import Foundation

/// A D-Bus session bus of the test's own (`dbus-daemon --session --nofork`, its socket in a
/// temporary directory) with a stand-in notification server that owns
/// `org.freedesktop.Notifications` and records each `Notify` call as a JSON line. Both are
/// children of the test, stopped by PID and waited for (`stop`, or on deinit).
public final class TestSessionBus: @unchecked Sendable {
    /// What brokerd is given as `DBUS_SESSION_BUS_ADDRESS`.
    public let address: String
    private let directory: TemporaryDirectory
    private let daemon: ChildProcess
    private var server: ChildProcess?

    /// The server: python3-dbus (Debian's python3) with a GLib main loop.
    private static let serverScript = """
        import json, sys
        import dbus, dbus.bus, dbus.service, dbus.mainloop.glib
        from gi.repository import GLib

        dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
        address, record, ready = sys.argv[1:4]
        bus = dbus.bus.BusConnection(address)

        class Notifications(dbus.service.Object):
            @dbus.service.method("org.freedesktop.Notifications", in_signature="susssasa{sv}i", out_signature="u")
            def Notify(self, app, replaces, icon, summary, body, actions, hints, timeout):
                with open(record, "a") as out:
                    out.write(json.dumps({"app": str(app), "summary": str(summary), "body": str(body)}) + "\\n")
                return 1

        name = dbus.service.BusName("org.freedesktop.Notifications", bus)
        Notifications(bus, "/org/freedesktop/Notifications")
        open(ready, "w").close()
        GLib.MainLoop().run()
        """

    /// Starts the bus and the server; returns once the server owns its name.
    public init() async throws {
        directory = try TemporaryDirectory()
        address = "unix:path=" + directory.file("bus")
        let environment = ["PATH": "/usr/bin:/bin", "HOME": directory.path]
        daemon = try ChildProcess.spawn(
            "/usr/bin/dbus-daemon", ["--session", "--nofork", "--address=\(address)"], environment: environment)
        do {
            try Self.serverScript.write(toFile: directory.file("server.py"), atomically: true, encoding: .utf8)
            try await Self.waitFor("the bus's socket") {
                FileManager.default.fileExists(atPath: self.directory.file("bus"))
            }
            server = try ChildProcess.spawn(
                "/usr/bin/python3",
                [directory.file("server.py"), address, directory.file("notifications"), directory.file("ready")],
                environment: environment)
            try await Self.waitFor("the notification server") {
                FileManager.default.fileExists(atPath: self.directory.file("ready"))
            }
        } catch {
            stop()
            throw error
        }
    }

    deinit { stop() }

    /// Stops the server and the bus, and waits for both.
    public func stop() {
        server?.stop(grace: 5)
        daemon.stop(grace: 5)
        directory.remove()
    }

    /// The `Notify` calls received so far: `app`, `summary` and `body` of each.
    public var notifications: [[String: String]] {
        let text = (try? String(contentsOfFile: directory.file("notifications"), encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: String]
        }
    }

    private static func waitFor(_ what: String, _ condition: () -> Bool) async throws {
        guard await eventually(timeout: 20, condition) else { throw HarnessError("\(what) did not come up") }
    }
}
