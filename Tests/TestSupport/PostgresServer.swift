import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A real PostgreSQL server (Debian's `postgresql` package) of a test's own: a cluster made by
/// `initdb` in a temporary directory, its `postgres` started on 127.0.0.1 at a free port (and on
/// one more address when asked, e.g. a test network's bridge) with password (SCRAM) authentication
/// for the user `tokenbroker`, owner of the database `tokenbroker`. PostgreSQL refuses to run as root, so under root both run as the system user
/// `postgres` (through `setpriv`, which execs: the child is the server itself). `stop` stops it
/// and waits for it; every test that starts one stops it on every path.
public final class PostgresServer: Sendable {
    public static let binaries = "/usr/lib/postgresql/15/bin"
    public let directory: TemporaryDirectory
    public let port: Int
    public let username = "tokenbroker"
    public let database = "tokenbroker"
    public let password: String
    /// The address the server listens on besides 127.0.0.1, if any.
    public let listenAddress: String?
    /// The running server; `nil` between `halt` and `resume`.
    private let server: Mutex<ChildProcess?>

    /// Whether this machine has PostgreSQL's binaries (`scripts/install-deps` installs them).
    public static var isInstalled: Bool { access(binaries + "/postgres", X_OK) == 0 }

    /// Makes and starts a server on a thread of its own (`onOwnThread`): initdb and the wait
    /// for the server take seconds, which must not hold a thread every test's tasks share.
    /// `listenAddress`: an address to listen on besides 127.0.0.1, where every client of the
    /// same /24 may log in (with the password).
    public static func start(listenAddress: String? = nil) async throws -> PostgresServer {
        try await onOwnThread { try PostgresServer(listenAddress: listenAddress) }
    }

    private init(listenAddress: String?) throws {
        self.listenAddress = listenAddress
        let directory = try TemporaryDirectory()
        self.directory = directory
        password = UUID().uuidString
        let owner = try Self.runAs()
        let data = directory.file("data")
        let passwordFile = directory.file("password")
        try Data(password.utf8).write(to: URL(fileURLWithPath: passwordFile))
        // Modes set whole: the umask may be anything at this instant (brokerd's socket server, in
        // this process for other tests, narrows it while it binds).
        for (path, mode) in [(directory.path, mode_t(0o700)), (passwordFile, mode_t(0o600))] {
            let owned = owner.map { chown(path, $0.uid, $0.gid) == 0 } ?? true
            guard owned, chmod(path, mode) == 0 else {
                throw HarnessError("cannot hand \(path) to the postgres user: \(String(cString: strerror(errno)))")
            }
        }
        let initdb = try ChildProcess.run(
            Self.command(owner),
            Self.arguments(owner) + [
                Self.binaries + "/initdb", "-D", data, "-U", username, "--pwfile", passwordFile,
                "--auth", "scram-sha-256", "-E", "UTF8", "--no-sync", "--no-instructions",
            ], environment: Self.environment, timeout: 120)
        guard initdb.status == 0 else {
            directory.remove()
            throw HarnessError("initdb failed (\(initdb.status)): \(initdb.output)")
        }
        unlink(passwordFile)
        port = try freePort()
        let server: ChildProcess
        do {
            if let listenAddress {
                let hba = try String(contentsOfFile: data + "/pg_hba.conf", encoding: .utf8)
                try (hba + "host all all \(listenAddress)/24 scram-sha-256\n").write(
                    toFile: data + "/pg_hba.conf", atomically: false, encoding: .utf8)
            }
            server = try Self.spawnServer(data: data, port: port, listenAddress: listenAddress, in: directory.path)
        } catch {
            directory.remove()
            throw error
        }
        self.server = Mutex(server)
        do {
            try Self.waitUntilAccepting(port: port, server: server)
            let created = try ChildProcess.run(
                Self.binaries + "/createdb", ["-h", "127.0.0.1", "-p", String(port), "-U", username, database],
                environment: Self.environment.merging(["PGPASSWORD": password]) { $1 }, timeout: 60)
            guard created.status == 0 else { throw HarnessError("createdb failed: \(created.output)") }
        } catch {
            stopServer(server)
            directory.remove()
            throw error
        }
    }

    /// Stops the server (a fast shutdown: clients are disconnected), waits for it and removes
    /// its directory.
    public func stop() {
        halt()
        directory.remove()
    }

    /// Stops the server (a fast shutdown) and waits for it, keeping its data for `resume`; does
    /// nothing when it is stopped already.
    public func halt() {
        let running = server.withLock { server in
            defer { server = nil }
            return server
        }
        if let running { stopServer(running) }
    }

    /// Starts the server again after `halt`, on the same port and data, and waits (on a thread
    /// of its own) until it accepts connections.
    public func resume() async throws {
        try await onOwnThread {
            try self.server.withLock { server in
                guard server == nil else { return }
                let started = try Self.spawnServer(
                    data: self.directory.file("data"), port: self.port, listenAddress: self.listenAddress,
                    in: self.directory.path)
                server = started
                try Self.waitUntilAccepting(port: self.port, server: started)
            }
        }
    }

    private static func spawnServer(data: String, port: Int, listenAddress: String?, in directory: String) throws
        -> ChildProcess
    {
        let owner = try runAs()
        let addresses = ["127.0.0.1"] + (listenAddress.map { [$0] } ?? [])
        return try ChildProcess.spawn(
            command(owner),
            arguments(owner) + [
                binaries + "/postgres", "-D", data, "-p", String(port), "-c",
                "listen_addresses=" + addresses.joined(separator: ","), "-c", "unix_socket_directories=" + directory,
                "-c", "max_connections=200",
            ], environment: environment, output: nil)
    }

    /// Runs `pg_dump` of the database (data and schema) and returns what it printed, less the
    /// `\restrict` lines, whose key is new in every dump.
    public func dump() async throws -> String {
        try await onOwnThread { try self.dumpHere() }
    }

    private func dumpHere() throws -> String {
        let result = try ChildProcess.capture(
            Self.binaries + "/pg_dump", ["-h", "127.0.0.1", "-p", String(port), "-U", username, database],
            environment: Self.environment.merging(["PGPASSWORD": password]) { $1 }, timeout: 60)
        guard result.status == 0 else { throw HarnessError("pg_dump failed: \(result.stderr)") }
        return result.stdout.split(separator: "\n", omittingEmptySubsequences: false)
            .filter { !$0.hasPrefix("\\restrict") && !$0.hasPrefix("\\unrestrict") }.joined(separator: "\n")
    }

    /// Runs `sql` with `psql` as the database's owner (a test's hand on the rows).
    public func execute(_ sql: String) async throws {
        _ = try await onOwnThread { try self.executeHere(sql) }
    }

    /// Turns TLS on with `certificate` and `key` (copied beside the data, the server's user's own,
    /// mode 0600) and has the extra address (`listenAddress`) take TLS connections only
    /// (`hostssl`); returns once the server has reloaded its configuration.
    public func requireTLS(certificate: String, key: String) async throws {
        guard let listenAddress else { throw HarnessError("TLS is asked of the extra address only") }
        try await onOwnThread {
            let owner = try Self.runAs()
            for (source, name) in [(certificate, "server.crt"), (key, "server.key")] {
                let path = self.directory.file(name)
                try FileManager.default.copyItem(atPath: source, toPath: path)
                let owned = owner.map { chown(path, $0.uid, $0.gid) == 0 } ?? true
                guard owned, chmod(path, 0o600) == 0 else {
                    throw HarnessError("cannot hand \(path) to the postgres user: \(String(cString: strerror(errno)))")
                }
            }
            let hba = self.directory.file("data") + "/pg_hba.conf"
            let rules = try String(contentsOfFile: hba, encoding: .utf8).replacingOccurrences(
                of: "host all all \(listenAddress)/24", with: "hostssl all all \(listenAddress)/24")
            try rules.write(toFile: hba, atomically: false, encoding: .utf8)
            for setting in [
                "ssl_cert_file = '\(self.directory.file("server.crt"))'",
                "ssl_key_file = '\(self.directory.file("server.key"))'", "ssl = on",
            ] {
                try self.executeHere("ALTER SYSTEM SET " + setting)
            }
            try self.executeHere("SELECT pg_reload_conf()")
            // The reload is a signal: the settings take effect a moment later.
            let on = try Poll.blocking(timeout: 30, every: .milliseconds(20)) {
                try self.executeHere("SHOW ssl").trimmingCharacters(in: .whitespacesAndNewlines) == "on"
            }
            guard on else { throw HarnessError("postgres did not turn TLS on") }
        }
    }

    /// Runs `sql` through psql, stopping at the first error; its output, unaligned and
    /// without headers.
    @discardableResult
    private func executeHere(_ sql: String) throws -> String {
        let result = try ChildProcess.run(
            Self.binaries + "/psql",
            [
                "-h", "127.0.0.1", "-p", String(port), "-U", username, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql,
                database,
            ],
            environment: Self.environment.merging(["PGPASSWORD": password]) { $1 }, timeout: 60)
        guard result.status == 0 else { throw HarnessError("psql failed: \(result.output)") }
        return result.output
    }

    private func stopServer(_ server: ChildProcess) {
        if !server.hasExited() { kill(server.pid, SIGINT) }
        if !Poll.blocking(timeout: 30, every: .milliseconds(20), { server.hasExited() }) { kill(server.pid, SIGKILL) }
        server.wait()
    }

    private static let environment = ["PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"]

    /// The `postgres` system user's ids when this runs as root; `nil` otherwise.
    private static func runAs() throws -> (uid: uid_t, gid: gid_t)? {
        guard getuid() == 0 else { return nil }
        guard let entry = getpwnam("postgres") else {
            throw HarnessError("no postgres user: install Debian's postgresql package (scripts/install-deps)")
        }
        return (entry.pointee.pw_uid, entry.pointee.pw_gid)
    }

    private static func command(_ owner: (uid: uid_t, gid: gid_t)?) -> String {
        owner == nil ? "/usr/bin/env" : "/usr/bin/setpriv"
    }

    private static func arguments(_ owner: (uid: uid_t, gid: gid_t)?) -> [String] {
        guard let owner else { return [] }
        return ["--reuid=\(owner.uid)", "--regid=\(owner.gid)", "--clear-groups", "--"]
    }

    /// Waits (up to 60 s) until the server accepts TCP connections on `port`.
    private static func waitUntilAccepting(port: Int, server: ChildProcess) throws {
        let accepting = try Poll.blocking(timeout: 60, every: .milliseconds(50)) {
            if server.hasExited() { throw HarnessError("postgres exited at start") }
            let ready = try ChildProcess.run(
                binaries + "/pg_isready", ["-q", "-h", "127.0.0.1", "-p", String(port)], environment: environment,
                timeout: 10)
            return ready.status == 0
        }
        guard accepting else { throw HarnessError("postgres did not accept connections within 60 s") }
    }
}
