import FoundationEssentials
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `broker-bench fleet`: what sharing an account through the fleet's PostgreSQL store costs
/// (docs/fleet.md), on a real PostgreSQL made by initdb and test IdPs that rotate the refresh
/// token at every refresh and refuse a used one. Brokers are processes on this machine, each a
/// host of the fleet. Prints `key=value` lines for `broker-bench table` through `figures`:
/// - IdP calls per rotation with 3 and with 10 brokers serving one account to a few clients each
///   for several token lifetimes, and how many refresh tokens were presented twice;
/// - a forced refresh of a shared account beside one of a local account on the same broker (an
///   IdP of the same kind each: a test IdP holds one chain of refresh tokens), and the
///   statements PostgreSQL ran per shared refresh;
/// - cached tokens of the shared account beside the local one, on that broker in the same run.
///
/// Every broker is stopped and waited for by its PID, and PostgreSQL stopped, on every path.
struct FleetBench {
    /// The tools, the C load client's runs and the output.
    let figures: Figures
    /// Seconds an access token lives in the rotation runs: short, so that a run holds several.
    static let lifetime = 4
    /// Token lifetimes each rotation run lasts.
    let lifetimes = 6
    /// Clients asking each broker, all at once every `interval` seconds.
    let clientsPerBroker = 4
    let interval = 0.1
    /// Forced refreshes timed per account.
    let refreshes = 30
    /// Load runs per account, interleaved and each round in the other order than the last, so
    /// that a drift of the shared machine hits both alike.
    let rounds = 10

    func run() async throws {
        let server = try await PostgresServer.start()
        defer { server.stop() }
        let keys = try TemporaryDirectory()
        defer { keys.remove() }
        let key = keys.file("fleet.key")
        let made = try await ChildProcess.capture(
            BrokerProcess.binary("brokerctl").path, ["fleet", "init", "--key-file", key],
            environment: ["PATH": "/usr/bin:/bin"])
        guard made.status == 0 else { throw BenchError("brokerctl fleet init failed: \(made.stderr)") }
        try await countStatements(on: server)
        for brokers in [3, 10] {
            try await rotations(brokers: brokers, server: server, key: key)
        }
        try await sharedBesideLocal(server: server, key: key)
    }

    // MARK: Rotations

    /// `count` brokers serve one shared account for `lifetimes` token lifetimes, each asked by
    /// `clientsPerBroker` clients; then the IdP's record gives its calls per rotation (a
    /// rotation: a call that presented the current refresh token, answered with a new one) and
    /// the presentations of a refresh token presented before. The row is deleted afterwards, so
    /// that the next run's brokers do not refresh it.
    private func rotations(brokers count: Int, server: PostgresServer, key: String) async throws {
        let account = "rotating-\(count)"
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-\(account)", lifetime: Self.lifetime)
        do {
            try await rotations(brokers: count, account: account, idp: idp, server: server, key: key)
        } catch {
            await idp.shutdown()
            throw error
        }
        await idp.shutdown()
        try psql(server, "DELETE FROM tokenbroker_accounts")
    }

    private func rotations(
        brokers count: Int, account: String, idp: OAuth2TestIdP, server: PostgresServer, key: String
    ) async throws {
        var brokers: [BrokerProcess] = []
        defer { brokers.forEach { $0.stop() } }
        // The lease is 3 request timeouts, its least (docs/configuration.md), so that a host reads
        // the store every 6 s.
        for host in 0..<count {
            let broker = try fleetBroker(
                server: server, key: key, host: "host-\(host)", broker: "request_timeout = 2",
                fleet: "lease_seconds = 6")
            brokers.append(broker)
            try await broker.start()
            // The others start after the account is shared, and serve it from its row.
            if host == 0 { try await add(account, on: broker, idp: idp, shared: true) }
        }
        let clients = try brokers.flatMap { broker in
            try (0..<clientsPerBroker).map { _ in try RawConnection(path: broker.socketPath) }
        }
        for broker in brokers { try waitForToken(of: account, on: broker) }
        figures.note("\(count) brokers share \(account); \(clients.count) clients for \(lifetimes * Self.lifetime) s")
        let failed = try askInTurns(clients, account: account, seconds: Double(Self.lifetime * lifetimes))
        let calls = idp.refreshCalls
        let rotations = calls.filter(\.presentedCurrent).count
        guard rotations > 0 else { throw BenchError("\(account) was never refreshed") }
        figures.emit("fleet_idp_calls_per_rotation_\(count)", Double(calls.count) / Double(rotations))
        figures.emit("fleet_rotations_\(count)", Double(rotations))
        let presented = Set(calls.compactMap(\.refreshToken))
        figures.emit("fleet_reused_refresh_tokens_\(count)", Double(calls.count - presented.count))
        figures.emit("fleet_failed_token_answers_\(count)", Double(failed))
    }

    /// Every client asks for a token valid 1 s more, all at once, every `interval` seconds for
    /// `seconds`; returns how many answers were errors. A broker that stays silent for 10 s (the
    /// connections' read timeout) ends the run.
    private func askInTurns(_ clients: [RawConnection], account: String, seconds: Double) throws -> Int {
        let request = #"{"id":1,"op":"token","account":"\#(account)","min_ttl":1}"# + "\n"
        var line = LineReader()
        var failed = 0
        let end = Monotonic.now() + seconds
        while Monotonic.now() < end {
            let turn = Monotonic.now()
            for client in clients { client.send(request) }
            for client in clients {
                guard line.read(from: client.descriptor) else { throw BenchError("a broker did not answer") }
                if !line.contains(#""ok":true"#) { failed += 1 }
            }
            let rest = turn + interval - Monotonic.now()
            if rest > 0 { usleep(UInt32(rest * 1e6)) }
        }
        return failed
    }

    // MARK: A shared account beside a local one

    /// One broker holds a shared and a local account, each on an IdP of its own with tokens
    /// valid an hour. Forced refreshes (the owner's `refresh`) of the two alternate; each must
    /// cost its IdP one call. Then cached tokens of each at 64 connections, in alternating runs.
    private func sharedBesideLocal(server: PostgresServer, key: String) async throws {
        let sharedIdP = try await OAuth2TestIdP(initialRefreshToken: "rt-shared", lifetime: 3600)
        let localIdP: OAuth2TestIdP
        do {
            localIdP = try await OAuth2TestIdP(initialRefreshToken: "rt-local", lifetime: 3600)
        } catch {
            await sharedIdP.shutdown()
            throw error
        }
        do {
            try await sharedBesideLocal(server: server, key: key, sharedIdP: sharedIdP, localIdP: localIdP)
        } catch {
            await sharedIdP.shutdown()
            await localIdP.shutdown()
            throw error
        }
        await sharedIdP.shutdown()
        await localIdP.shutdown()
    }

    private func sharedBesideLocal(
        server: PostgresServer, key: String, sharedIdP: OAuth2TestIdP, localIdP: OAuth2TestIdP
    ) async throws {
        // A lease of a minute: the broker's own reads of the store (once a lease) stay out of
        // the count of statements.
        let broker = try fleetBroker(
            server: server, key: key, host: "bench", broker: "request_timeout = 5", fleet: "lease_seconds = 60")
        try await broker.start()
        defer { broker.stop() }
        let accounts = [(name: "shared", idp: sharedIdP), (name: "local", idp: localIdP)]
        for account in accounts {
            try await add(account.name, on: broker, idp: account.idp, shared: account.name == "shared")
            try waitForToken(of: account.name, on: broker)
        }

        let owner = try RawConnection(path: broker.socketPath)
        var elapsed: [String: [Double]] = [:]
        try psql(server, "SELECT pg_stat_statements_reset()")
        for _ in 0..<refreshes {
            for account in accounts {
                let callsBefore = account.idp.callCount
                let start = Monotonic.now()
                let answer = owner.request(#"{"id":1,"op":"refresh","account":"\#(account.name)"}"#)
                elapsed[account.name, default: []].append((Monotonic.now() - start) * 1000)
                guard answer?.contains(#""ok":true"#) == true else {
                    throw BenchError("refresh failed: \(answer ?? "")")
                }
                let calls = account.idp.callCount - callsBefore
                guard calls == 1 else { throw BenchError("\(calls) IdP calls for one refresh of \(account.name)") }
            }
        }
        let statements = try ranStatements(server)
        let shared = figures.median(elapsed["shared"] ?? [])
        let local = figures.median(elapsed["local"] ?? [])
        figures.emit("fleet_refresh_latency_shared_ms", shared)
        figures.emit("fleet_refresh_latency_local_ms", local)
        figures.emit("fleet_refresh_added_ms", shared - local)
        figures.emit("fleet_db_round_trips_per_refresh", Double(statements) / Double(refreshes))

        var runs: [String: [LoadClientResult]] = [:]
        for round in 1...rounds {
            for account in round % 2 == 1 ? accounts : accounts.reversed() {
                let result = try figures.load(broker.socketPath, connections: 64, account: account.name)
                figures.note("round \(round) \(account.name): \(Int(result.rps)) req/s, p99 \(Int(result.p99)) us")
                runs[account.name, default: []].append(result)
            }
        }
        for (name, results) in runs.sorted(by: { $0.key < $1.key }) {
            figures.emit("fleet_cached_\(name)_rps", figures.median(results.map(\.rps)))
            figures.emit("fleet_cached_\(name)_p99_us", figures.median(results.map(\.p99)))
        }
    }

    // MARK: PostgreSQL

    /// Has PostgreSQL count the statements it runs (pg_stat_statements, loaded at start: the
    /// server is started again). Its counts are kept as each statement ends, where
    /// pg_stat_database's transaction counts reach the view up to 10 s late.
    private func countStatements(on server: PostgresServer) async throws {
        try psql(server, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        server.halt()
        try await server.resume()
        try psql(server, "CREATE EXTENSION pg_stat_statements")
    }

    /// The statements the brokers ran since `pg_stat_statements_reset()`: each one a round trip
    /// (postgres-nio sends a statement and waits for its answer; a transaction's BEGIN and
    /// COMMIT are statements of their own). What each ran, without its parameters, goes to
    /// standard error.
    private func ranStatements(_ server: PostgresServer) throws -> Int {
        let brokers =
            "dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            + "AND query NOT LIKE '%pg_stat_statements%'"
        let each = try psql(
            server,
            "SELECT calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 90) FROM pg_stat_statements WHERE \(brokers) "
                + "ORDER BY calls DESC")
        for line in each.split(separator: "\n") { figures.note("statements: \(line)") }
        let total = try psql(server, "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE \(brokers)")
        guard let count = total.split(separator: "\n").first.flatMap({ Int($0) }) else {
            throw BenchError("pg_stat_statements gave no count")
        }
        return count
    }

    /// Runs `sql` with psql as the database's owner; returns the rows, unaligned.
    @discardableResult
    private func psql(_ server: PostgresServer, _ sql: String) throws -> String {
        let result = try ChildProcess.capture(
            PostgresServer.binaries + "/psql",
            [
                "-h", "127.0.0.1", "-p", String(server.port), "-U", server.username, "-At", "-v", "ON_ERROR_STOP=1",
                "-c", sql, server.database,
            ],
            environment: ["PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PGPASSWORD": server.password])
        guard result.status == 0 else { throw BenchError("psql failed: \(result.stderr)") }
        return result.stdout
    }

    // MARK: Brokers

    /// A broker whose broker.toml joins the fleet of `server` as `host`, with the database
    /// password in a file of its own; `broker` and `fleet` are more lines of those tables.
    private func fleetBroker(server: PostgresServer, key: String, host: String, broker settings: String, fleet: String)
        throws -> BrokerProcess
    {
        let broker = try BrokerProcess(brokerd: figures.tools.brokerd)
        let passwordFile = broker.configDirectory.appendingPathComponent("db-password").path
        try FileManager.default.createDirectory(at: broker.configDirectory, withIntermediateDirectories: true)
        try Data((server.password + "\n").utf8).write(to: URL(fileURLWithPath: passwordFile))
        chmod(passwordFile, 0o600)
        try broker.writeConfig(
            """
            [broker]
            \(settings)
            [fleet]
            database = "postgresql://\(server.username)@127.0.0.1:\(server.port)/\(server.database)"
            password_file = "\(passwordFile)"
            key_file = "\(key)"
            host = "\(host)"
            \(fleet)
            """)
        return broker
    }

    /// Adds `name` on `broker` with `brokerctl add` (`--shared`: to the fleet), holding the
    /// IdP's refresh token and client secret, given on standard input.
    private func add(_ name: String, on broker: BrokerProcess, idp: OAuth2TestIdP, shared: Bool) async throws {
        let added = try await broker.brokerctl(
            ["add", name] + (shared ? ["--shared"] : []) + [
                "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id", idp.clientID, "--secrets",
                "-",
            ],
            stdin: #"{"refresh_token": "rt-\#(name)", "client_secret": "\#(idp.clientSecret)"}"#)
        guard added.status == 0 else { throw BenchError("brokerctl add \(name) failed: \(added.stderr)") }
    }

    /// Waits (up to 15 s) until `broker` serves a token of `name`, so that the figures start
    /// with every broker serving it.
    private func waitForToken(of name: String, on broker: BrokerProcess) throws {
        let connection = try RawConnection(path: broker.socketPath)
        let deadline = Monotonic.now() + 15
        while connection.request(#"{"id":1,"op":"token","account":"\#(name)","min_ttl":0}"#)?.contains(#""ok":true"#)
            != true
        {
            guard Monotonic.now() < deadline else { throw BenchError("\(name) is not served within 15 s") }
            usleep(100_000)
        }
    }
}
