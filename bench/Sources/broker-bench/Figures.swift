import FoundationEssentials
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `broker-bench figures`: measures the broker's figures, each beside its yardstick in the same
/// run, and prints them on standard output as `key=value` lines for `broker-bench table`.
/// Progress goes to standard error. Every process it starts is stopped and waited for.
struct Figures {
    /// The programs measured and the yardsticks (the C load client and echo floor of
    /// bench/yardsticks, compiled by bench/run).
    struct Tools {
        let brokerd: String
        let loadClient: String
        let echoServer: String
    }

    let tools: Tools
    let secondsPerLoad: Double
    /// Load runs per server, interleaved so that a drift of the shared machine hits all alike.
    let rounds = 5
    /// Seconds the IdP waits before it answers the refresh 1,000 clients wait for.
    let fanOutDelay = 0.05
    /// Starts timed to READY=1.
    let starts = 7
    /// Refreshes timed with waiting clients.
    let refreshes = 5
    /// Seconds a started broker idles before its memory is read.
    let settleSeconds: UInt32 = 3
    /// Requests each load run sends before it measures.
    let warmup = 2000
    let began = Monotonic.now()

    func run() async throws {
        try await cachedTokens(brokers: BrokerSetup.all, againstEcho: true)
        try await freshTokens()
        try await idleMemoryAndStart()
    }

    /// Only the fresh-token figures (`broker-bench fresh`).
    func runFresh() async throws {
        try await freshTokens()
    }

    /// Only the cached-token figures with and without a DPoP proof (`broker-bench dpop`).
    func runDPoP() async throws {
        try await cachedTokens(brokers: [.shipped, .dpop], againstEcho: false)
    }

    /// Only the cached-token figures with and without an access policy (`broker-bench policy`).
    func runPolicy() async throws {
        try await cachedTokens(brokers: [.shipped, .policy], againstEcho: false)
    }

    // MARK: Memory and start-up

    /// Resident memory of an idle broker with 1 and with 1,000 accounts (all of it, the
    /// anonymous part and the file-backed part), and the time from start to READY=1 with 1,000.
    private func idleMemoryAndStart() async throws {
        try await idleResident(of: BrokerProcess(brokerd: tools.brokerd), accounts: 1)
        let many = try BrokerProcess(brokerd: tools.brokerd)
        try await idleResident(of: many, accounts: 1000)
        var elapsed: [Double] = []
        for _ in 0..<starts {
            let seconds = try await many.startTimingReady()
            many.stop()
            elapsed.append(seconds * 1000)
        }
        emit("ready_1000_p50_ms", median(elapsed))
        emit("ready_1000_best_ms", elapsed.min() ?? .nan)
    }

    /// Fills a new broker with `accounts` static accounts, starts it again from its vault, lets
    /// it settle, has it serve one token (so the figure holds the code a request runs, not only
    /// what an untouched broker keeps) and emits its resident memory in MiB a second later:
    /// VmRSS, RssAnon (the heap and stacks) and RssFile (code and data the kernel can read again
    /// from the files).
    private func idleResident(of broker: BrokerProcess, accounts: Int) async throws {
        note("filling a broker with \(accounts) account(s)")
        try await broker.start()
        do {
            try broker.addStaticAccounts(range: 0..<accounts)
            emit("rss_after_adding_\(accounts)_mib", broker.residentMiB)
            broker.stop()
        } catch {
            broker.stop()
            throw error
        }
        try await broker.start()
        defer { broker.stop() }
        sleep(settleSeconds)
        let answer = try RawConnection(path: broker.socketPath).request(#"{"id":1,"op":"token","account":"bench-0"}"#)
        guard answer?.contains(#""ok":true"#) == true else { throw BenchError("no token: \(answer ?? "no answer")") }
        sleep(1)
        for (key, field) in [("rss", "VmRSS"), ("rss_anon", "RssAnon"), ("rss_file", "RssFile")] {
            emit("\(key)_idle_\(accounts)_mib", Double(try broker.residentKiB(field)) / 1024)
        }
    }

    // MARK: Cached tokens

    /// A brokerd the cached-token figures measure, and the key prefix of its figures.
    struct BrokerSetup {
        var name: String
        var eventLoops: Int?
        /// Whether the account is behind a rule of three executables, the load client last.
        var policy = false
        /// Whether the account is a DPoP one, asked for a proof with every token.
        var dpop = false

        static let shipped = BrokerSetup(name: "token")
        static let policy = BrokerSetup(name: "policy", policy: true)
        static let dpop = BrokerSetup(name: "dpop", dpop: true)
        static let all = [
            shipped, policy, dpop, BrokerSetup(name: "loops1", eventLoops: 1), .init(name: "loops2", eventLoops: 2),
        ]

        /// The request the load client sends.
        var line: String {
            dpop
                ? #"{"id":1,"op":"token","account":"bench-0","dpop":{"htm":"GET","htu":"https://api.example/v1/items"}}"#
                : #"{"id":1,"op":"token","account":"bench-0"}"#
        }
    }

    /// Cached `token` requests from the C load client at 64 connections and at 1: against the C
    /// echo floor and SwiftNIO's echo (`broker-bench echo-server`), brokerd as shipped, brokerd
    /// with an access policy on the account, and brokerd with 1 and with 2 event loops; with the CPU time each server spent per request.
    private func cachedTokens(brokers setups: [BrokerSetup], againstEcho: Bool) async throws {
        let workspace = try TemporaryDirectory()
        defer { workspace.remove() }
        var servers: [(name: String, path: String, process: ChildProcess, line: String)] = []
        var echo: ChildProcess?
        defer { echo?.stop() }
        if againstEcho {
            let echoPath = workspace.file("echo.sock")
            let process = try ChildProcess.spawn(tools.echoServer, [echoPath, "900"], environment: [:])
            echo = process
            _ = try RawConnection(path: echoPath, waitingUpTo: 5)
            servers.append(("echo", echoPath, process, BrokerSetup.shipped.line))
        }
        var brokers: [BrokerProcess] = []
        defer { brokers.forEach { $0.stop() } }
        for setup in setups {
            let broker = try BrokerProcess(brokerd: tools.brokerd)
            brokers.append(broker)
            if setup.policy {
                // A rule lists absolute paths; the tools may be given relative to here.
                let executables = [tools.brokerd, "/usr/bin/env", tools.loadClient].map {
                    "\"\(URL(fileURLWithPath: $0).standardizedFileURL.path)\""
                }
                try broker.writeConfig(
                    "[accounts.bench-0.access]\nexecutables = [\(executables.joined(separator: ", "))]\n")
            }
            try await broker.start(
                environment: setup.eventLoops.map { ["TOKENBROKER_EVENT_LOOPS": String($0)] } ?? [:])
            guard let process = broker.process else { throw BenchError("brokerd \(setup.name) is not running") }
            servers.append((setup.name, broker.socketPath, process, setup.line))
            if setup.dpop {
                try broker.addDPoPAccount(name: "bench-0")
            } else {
                try broker.addStaticAccounts(range: 0..<1)
            }
        }
        if let shipped = servers.first(where: { $0.name == BrokerSetup.shipped.name }) {
            emit("default_event_loops", Double(shipped.process.threads(named: "NIO-SGLTN-")))
        }
        var nioEcho: ChildProcess?
        defer { nioEcho?.stop() }
        if againstEcho, let shipped = servers.first(where: { $0.name == BrokerSetup.shipped.name }) {
            // SwiftNIO alone, answering with as many bytes as the broker does, on one event loop.
            let answer = try RawConnection(path: shipped.path).request(#"{"id":1,"op":"token","account":"bench-0"}"#)
            guard let answer else { throw BenchError("brokerd did not answer") }
            let path = workspace.file("nio-echo.sock")
            let process = try ChildProcess.spawn(
                CommandLine.arguments[0], ["echo-server", path, "1", String(answer.utf8.count + 1)], environment: [:])
            nioEcho = process
            _ = try RawConnection(path: path, waitingUpTo: 5)
            servers.insert(("nioecho", path, process, BrokerSetup.shipped.line), at: 1)
        }

        var runs: [String: [LoadClientResult]] = [:]
        var cpuPerRequest: [String: [Double]] = [:]
        for round in 1...rounds {
            for server in servers {
                for connections in [64, 1] {
                    let cpuBefore = server.process.cpuSeconds()
                    let result = try load(server.path, connections: connections, line: server.line)
                    let cpu = (server.process.cpuSeconds() - cpuBefore) * 1e6 / Double(result.completed + warmup)
                    cpuPerRequest["\(server.name)_\(connections)", default: []].append(cpu)
                    note(
                        "round \(round) \(server.name) \(connections) conn: \(Int(result.rps)) req/s, "
                            + "p50 \(Int(result.p50)) us, p99 \(Int(result.p99)) us")
                    runs["\(server.name)_\(connections)", default: []].append(result)
                }
            }
        }
        for (key, results) in runs.sorted(by: { $0.key < $1.key }) {
            emit(key + "_rps", median(results.map(\.rps)))
            emit(key + "_p50_us", median(results.map(\.p50)))
            emit(key + "_p99_us", median(results.map(\.p99)))
            emit(key + "_cpu_us_per_request", median(cpuPerRequest[key] ?? []))
        }
    }

    /// One closed-loop run of the C load client sending `line` (a request for `account`'s token
    /// by default); the same parameters for every server.
    func load(_ socket: String, connections: Int, account: String = "bench-0", line: String? = nil) throws
        -> LoadClientResult
    {
        let (status, output, errors) = try ChildProcess.capture(
            tools.loadClient,
            [
                "-s", socket, "-m", "line", "-p", line ?? #"{"id":1,"op":"token","account":"\#(account)"}"#, "-e",
                #""access_token""#, "-c", String(connections), "-n", "3000000", "-t", String(secondsPerLoad), "-w",
                String(warmup),
            ], environment: ProcessInfo.processInfo.environment)
        guard status == 0 else { throw BenchError("the load client failed (\(status)): \(errors.suffix(500))") }
        let result = try JSONDecoder().decode(LoadClientResult.self, from: Data(output.utf8))
        guard result.errors == 0, result.completed > 0, [result.rps, result.p50, result.p99].allSatisfy(\.isFinite)
        else { throw BenchError("load run on \(socket) failed: \(result.errors) errors, \(result.completed) answers") }
        return result
    }

    // MARK: Fresh tokens

    /// From an expired token to fresh ones in the hands of 1 and of 1,000 waiting clients (one
    /// refresh shared by all), and the same after a `reject`; the in-process test IdP on
    /// loopback stamps each call it receives, so the figures are taken from its answer too.
    ///
    /// With 1,000 clients the IdP answers `fanOutDelay` after the call: sending 1,000 requests
    /// and the broker reading them take milliseconds, and an IdP answering sooner would be
    /// answering before the clients wait, which the figure after its answer would then count.
    private func freshTokens() async throws {
        let broker = try BrokerProcess(brokerd: tools.brokerd)
        // Clients' requests refresh an account at most once per minimum_refresh_interval
        // (docs/limits.md): each measured refresh waits out a short one first.
        try broker.writeConfig("[broker]\nminimum_refresh_interval = 0.1\n")
        try await broker.start()
        defer { broker.stop() }
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-bench", lifetime: 3600)
        do {
            try broker.addOAuth2Account(
                name: "fresh", endpoint: idp.tokenEndpoint, clientID: idp.clientID, refreshToken: "rt-bench")
            for waiting in [1, 1000] {
                // The same connections for every run: the broker never holds two sets at once.
                let clients = try (0..<waiting).map { _ in try RawConnection(path: broker.socketPath) }
                let delay = waiting > 1 ? fanOutDelay : 0
                idp.setDelay(.milliseconds(Int(delay * 1000)))
                try measureRefreshes(idp: idp, answerDelay: delay, key: "expired_\(waiting)") {
                    usleep(200_000)
                    return try broker.expiredLatency(
                        account: "fresh", clients: clients, refreshToken: idp.issuedRefreshTokens.last ?? "")
                }
                try measureRefreshes(idp: idp, answerDelay: delay, key: "refused_\(waiting)") {
                    usleep(200_000)
                    return try broker.rejectLatency(account: "fresh", clients: clients)
                }
            }
        } catch {
            await idp.shutdown()
            throw error
        }
        await idp.shutdown()
    }

    /// Runs `measure` `refreshes` times; each run must cost the IdP exactly one call, which it
    /// answers `answerDelay` seconds after it came. Emits the medians of: the IdP's answer, the
    /// first and the last client served, after the expiry; and the last client served after the
    /// IdP's answer.
    private func measureRefreshes(
        idp: OAuth2TestIdP, answerDelay: Double, key: String, _ measure: () throws -> FreshTokenTimes
    ) throws {
        var idpAnswers: [Double] = []
        var firsts: [Double] = []
        var lasts: [Double] = []
        var lastsAfterAnswer: [Double] = []
        for _ in 0..<refreshes {
            let callsBefore = idp.callCount
            let times = try measure()
            let calls = idp.calls
            guard calls.count == callsBefore + 1, let called = calls.last?.at.timeIntervalSince1970 else {
                throw BenchError("\(key): \(calls.count - callsBefore) IdP calls for one refresh")
            }
            let answered = called + answerDelay
            idpAnswers.append((answered - times.start) * 1000)
            firsts.append((times.first - times.start) * 1000)
            lasts.append((times.last - times.start) * 1000)
            lastsAfterAnswer.append((times.last - answered) * 1000)
        }
        emit(key + "_idp_answer_ms", median(idpAnswers))
        emit(key + "_first_ms", median(firsts))
        emit(key + "_last_ms", median(lasts))
        emit(key + "_last_after_idp_ms", median(lastsAfterAnswer))
    }

    // MARK: Output

    /// One figure, on standard output at once (and on standard error, to follow the run).
    func emit(_ key: String, _ value: Double) {
        write("\(key)=\(value)\n", to: STDOUT_FILENO)
        note("\(key)=\(value)")
    }

    func note(_ text: String) {
        write("[figures \(Int(Monotonic.now() - began)) s] " + text + "\n", to: STDERR_FILENO)
    }

    private func write(_ text: String, to descriptor: Int32) {
        _ = Array(text.utf8).withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
    }

    func median(_ values: [Double]) -> Double {
        values.isEmpty ? .nan : values.sorted()[values.count / 2]
    }
}

/// The JSON object the C load client prints (latencies in microseconds).
struct LoadClientResult: Decodable {
    var completed: Int
    var errors: Int
    var rps: Double
    var p50: Double
    var p99: Double

    enum CodingKeys: String, CodingKey {
        case completed, errors, rps
        case p50 = "p50_us"
        case p99 = "p99_us"
    }
}
