import BrokerProtocol
import Foundation
import NIOCore
import NIOPosix
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// broker-bench: latency and throughput of cached `token` requests over the broker's socket,
// side by side with a minimal echo server on the same kind of socket, plus memory and
// start-up time with 1,000 accounts, and durable saves with 1,000 accounts (VaultSave.swift).
// `broker-bench flood` measures the same requests while one process floods the broker
// (Flood.swift); `broker-bench vault-save` measures the saves alone. Run it through bench/run
// (release build).

let arguments = CommandLine.arguments
if arguments.count >= 3, arguments[1] == "echo-server" {
    try EchoServer.run(path: arguments[2])
}
var fileLimit = rlimit()
getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &fileLimit)
fileLimit.rlim_cur = fileLimit.rlim_max
setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &fileLimit)
if arguments.count >= 3, arguments[1] == "flood" {
    try Flood.run(brokerd: arguments[2], seconds: arguments.count >= 4 ? Double(arguments[3]) ?? 3 : 3)
    exit(0)
}
if arguments.count >= 2, arguments[1] == "vault-save" {
    let directory = "/tmp/tb-vault-save-\(getpid())"
    defer { try? FileManager.default.removeItem(atPath: directory) }
    try VaultSaveBench.run(directory: directory)
    exit(0)
}
guard arguments.count >= 2 else {
    FileHandle.standardError.write(
        Data("usage: broker-bench [flood] PATH-TO-BROKERD [SECONDS-PER-RUN] | broker-bench vault-save\n".utf8))
    exit(2)
}
let brokerd = arguments[1]
let seconds = arguments.count >= 3 ? Double(arguments[2]) ?? 3 : 3
let concurrencies = [1, 16, 64]
let workspace = "/tmp/tb-bench-\(getpid())"
defer { try? FileManager.default.removeItem(atPath: workspace) }

// 1. The floor: an echo server over a Unix socket, in its own process.
let echoPath = workspace + "/echo.sock"
try FileManager.default.createDirectory(atPath: workspace, withIntermediateDirectories: true)
let echo = try Child.spawn(CommandLine.arguments[0], ["echo-server", echoPath], environment: [:])
try Child.waitForSocket(echoPath)
let tokenLine = #"{"id":1,"op":"token","account":"bench-0"}"# + "\n"
var echoResults: [Int: LoadResult] = [:]
for clients in concurrencies {
    echoResults[clients] = try Load.run(path: echoPath, line: tokenLine, clients: clients, seconds: seconds)
}
echo.stop()

// 2. The broker, with one static account for the cached-token runs.
let broker = BrokerUnderTest(binary: brokerd, root: workspace + "/broker")
var process = try broker.start()
try broker.addStaticAccounts(range: 0..<1)
var brokerResults: [Int: LoadResult] = [:]
for clients in concurrencies {
    brokerResults[clients] = try Load.run(path: broker.socketPath, line: tokenLine, clients: clients, seconds: seconds)
}

print("cached token requests over the Unix socket, \(Int(seconds)) s per run (echo = minimal echo server, the floor)")
print("clients  server  p50 (us)  p99 (us)  req/s")
for clients in concurrencies {
    for (name, result) in [("echo", echoResults[clients]!), ("broker", brokerResults[clients]!)] {
        print(
            String(
                format: "%7d  %-6@  %8.1f  %8.1f  %7.0f", clients, name as NSString, result.p50, result.p99,
                result.perSecond))
    }
}
let one = (brokerResults[1]!, echoResults[1]!)
print(
    String(
        format:
            "at 1 client: p50 %.2fx and p99 %.2fx the echo floor (targets 1.3x, 2x); at 64 clients: %.0f req/s (target 100000)",
        one.0.p50 / one.1.p50, one.0.p99 / one.1.p99, brokerResults[64]!.perSecond))

// 3. From a refused token to the first waiting client holding a fresh one (one shared refresh).
let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-bench", lifetime: 3600)
try broker.addOAuth2Account(
    name: "fresh", endpoint: idp.tokenEndpoint, clientID: idp.clientID, refreshToken: "rt-bench")
for (label, measure) in [
    (
        "expired token",
        { try broker.expiredLatency(account: "fresh", clients: $0, refreshToken: idp.issuedRefreshTokens.last!) }
    ),
    ("refused token", { try broker.rejectLatency(account: "fresh", clients: $0) }),
] as [(String, (Int) throws -> (Double, Double))] {
    for waiting in [1, 1000] {
        var firsts: [Double] = []
        var lasts: [Double] = []
        for _ in 0..<5 {
            let (first, last) = try measure(waiting)
            firsts.append(first)
            lasts.append(last)
        }
        firsts.sort()
        lasts.sort()
        print(
            label
                + String(
                    format:
                        " -> fresh token, %4d waiting clients: first client %.2f ms, last client %.2f ms (median of 5; IdP on loopback)",
                    waiting, firsts[2] * 1000, lasts[2] * 1000))
    }
}
print("IdP calls for those \(5 * 4) refreshes: \(idp.callCount - 1)")
await idp.shutdown()

// 4. Memory and start-up with 1,000 accounts.
try broker.addStaticAccounts(range: 1..<1000)
print("resident memory with 1000 accounts: \(String(format: "%.1f", process.residentMiB())) MiB (target < 30)")
process.stop()
var startups: [Double] = []
for _ in 0..<5 {
    let (child, elapsed) = try broker.startTimingReady()
    startups.append(elapsed)
    child.stop()
}
startups.sort()
print(
    String(
        format: "start to READY=1 with 1000 accounts: median %.1f ms, best %.1f ms (target < 100)", startups[2] * 1000,
        startups[0] * 1000))

// 5. Durable saves with 1,000 accounts: as a client sees them, then the vault's two kinds side by side.
let saving = try broker.start()
try VaultSaveBench.setTokens(on: broker, accounts: 1000)
saving.stop()
try VaultSaveBench.run(directory: workspace + "/vault-save")

/// Latency figures of one load run.
struct LoadResult {
    var p50: Double
    var p99: Double
    var perSecond: Double
}

/// Closed-loop load: every client has its own connection and one request in flight. One
/// thread drives all connections with poll(2), so the load generator takes at most one core.
enum Load {
    static func run(path: String, line: String, clients: Int, seconds: Double) throws -> LoadResult {
        let descriptors = try (0..<clients).map { _ in try Socket.connect(path) }
        defer { descriptors.forEach { close($0) } }
        return try run(on: descriptors, line: line, seconds: seconds)
    }

    /// The same on connections opened beforehand (each with nothing in flight).
    static func run(on descriptors: [Int32], line: String, seconds: Double) throws -> LoadResult {
        let clients = descriptors.count
        let request = Array(line.utf8)
        var started = [Double](repeating: 0, count: clients)
        var latencies: [Double] = []
        latencies.reserveCapacity(1_000_000)
        var buffer = [UInt8](repeating: 0, count: 65536)
        var pending = [Int](repeating: 0, count: clients)
        var polls = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        let deadline = Monotonic.now() + seconds
        for index in 0..<clients {
            started[index] = Monotonic.now()
            _ = request.withUnsafeBytes { send(descriptors[index], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }
        while Monotonic.now() < deadline {
            guard poll(&polls, nfds_t(polls.count), 100) > 0 else { continue }
            for index in 0..<clients where polls[index].revents & Int16(POLLIN) != 0 {
                let count = recv(descriptors[index], &buffer, buffer.count, 0)
                guard count > 0 else { throw BenchError("the server closed a connection") }
                pending[index] += buffer[0..<count].reduce(0) { $0 + ($1 == 0x0A ? 1 : 0) }
                guard pending[index] > 0 else { continue }
                pending[index] -= 1
                let now = Monotonic.now()
                latencies.append(now - started[index])
                started[index] = now
                _ = request.withUnsafeBytes { send(descriptors[index], $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
        }
        latencies.sort()
        return LoadResult(
            p50: latencies[latencies.count / 2] * 1e6, p99: latencies[latencies.count * 99 / 100] * 1e6,
            perSecond: Double(latencies.count) / seconds)
    }
}

/// The real brokerd in a private directory.
struct BrokerUnderTest {
    let binary: String
    let root: String
    var socketPath: String { root + "/run/broker.sock" }

    var environment: [String: String] {
        [
            "HOME": root, "XDG_RUNTIME_DIR": root + "/run", "XDG_CONFIG_HOME": root + "/config",
            "XDG_STATE_HOME": root + "/state", "TOKENBROKER_SOCKET": socketPath,
        ]
    }

    func start() throws -> Child {
        try FileManager.default.createDirectory(atPath: root + "/run", withIntermediateDirectories: true)
        let child = try Child.spawn(binary, [], environment: environment)
        try Child.waitForSocket(socketPath)
        return child
    }

    /// Adds `bench-N` static accounts over the socket, pipelined.
    func addStaticAccounts(range: Range<Int>) throws {
        let fd = try Socket.connect(socketPath)
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 65536)
        for index in range {
            let line =
                #"{"id":\#(index),"op":"add","account":"bench-\#(index)","provider":{"kind":"static"},"tokens":{"access_token":"bench-token-\#(index)-\#(String(repeating: "x", count: 800))","expires_in":86400}}"#
                + "\n"
            _ = Array(line.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            let count = recv(fd, &buffer, buffer.count, 0)
            guard count > 0, String(decoding: buffer[0..<count], as: UTF8.self).contains("\"ok\":true") else {
                throw BenchError(
                    "adding account \(index) failed: \(String(decoding: buffer[0..<max(0, count)], as: UTF8.self))")
            }
        }
    }

    /// Adds an `oauth2` account and waits for its first token.
    func addOAuth2Account(name: String, endpoint: String, clientID: String, refreshToken: String) throws {
        let fd = try Socket.connect(socketPath)
        defer { close(fd) }
        let add =
            #"{"id":1,"op":"add","account":"\#(name)","provider":{"kind":"oauth2","token_endpoint":"\#(endpoint)","client_id":"\#(clientID)"},"tokens":{"refresh_token":"\#(refreshToken)"}}"#
        let token = #"{"id":2,"op":"token","account":"\#(name)"}"#
        for line in [add, token] {
            guard Socket.exchange(fd, line).contains("\"ok\":true") else { throw BenchError("cannot set up \(name)") }
        }
    }

    /// Every one of `clients` connections rejects the current token at once; returns the seconds
    /// until the first and the last of them holds the replacement.
    func rejectLatency(account: String, clients: Int) throws -> (Double, Double) {
        let probe = try Socket.connect(socketPath)
        let current = Socket.exchange(probe, #"{"id":0,"op":"token","account":"\#(account)","min_ttl":0}"#)
        close(probe)
        guard let range = current.range(of: #""access_token":""#),
            let end = current[range.upperBound...].firstIndex(of: "\"")
        else { throw BenchError("no token for \(account)") }
        let token = String(current[range.upperBound..<end])
        let descriptors = try (0..<clients).map { _ in try Socket.connect(socketPath) }
        defer { descriptors.forEach { close($0) } }
        let request = #"{"id":1,"op":"reject","account":"\#(account)","access_token":"\#(token)"}"#
        return try freshTokenLatency(request: request, start: Monotonic.now(), on: descriptors)
    }

    /// The account's token expires (pushed as expired, with the IdP's current refresh token);
    /// then every one of `clients` connections asks for a token. Returns the seconds from the
    /// expiry until the first and the last of them holds a fresh one.
    func expiredLatency(account: String, clients: Int, refreshToken: String) throws -> (Double, Double) {
        let descriptors = try (0..<clients).map { _ in try Socket.connect(socketPath) }
        defer { descriptors.forEach { close($0) } }
        let admin = try Socket.connect(socketPath)
        defer { close(admin) }
        let start = Monotonic.now()
        let pushed = Socket.exchange(
            admin,
            #"{"id":0,"op":"set_tokens","account":"\#(account)","tokens":{"access_token":"expired","expires_at":"2000-01-01T00:00:00Z","refresh_token":"\#(refreshToken)"}}"#
        )
        guard pushed.contains(#""ok":true"#) else { throw BenchError("set_tokens failed: \(pushed)") }
        let request = #"{"id":1,"op":"token","account":"\#(account)","min_ttl":60}"#
        return try freshTokenLatency(request: request, start: start, on: descriptors)
    }

    /// Sends `request` on every one of `descriptors` and returns the seconds from `start` until
    /// the first and the last successful answer.
    private func freshTokenLatency(request text: String, start: Double, on descriptors: [Int32]) throws -> (
        Double, Double
    ) {
        let request = Array((text + "\n").utf8)
        for fd in descriptors {
            _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }
        var first = Double.infinity
        var last = 0.0
        var buffer = [UInt8](repeating: 0, count: 4096)
        var polls = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        var remaining = descriptors.count
        while remaining > 0 {
            guard poll(&polls, nfds_t(polls.count), 10_000) > 0 else { throw BenchError("token answers timed out") }
            for index in polls.indices where polls[index].revents & Int16(POLLIN) != 0 {
                let count = recv(polls[index].fd, &buffer, buffer.count, 0)
                guard count > 0 else { throw BenchError("connection closed") }
                let answer = String(decoding: buffer[0..<count], as: UTF8.self)
                guard answer.contains(#""ok":true"#) else { throw BenchError("no fresh token: \(answer)") }
                let elapsed = Monotonic.now() - start
                first = min(first, elapsed)
                last = max(last, elapsed)
                polls[index].fd = -1
                remaining -= 1
            }
        }
        return (first, last)
    }

    /// Starts brokerd with a NOTIFY_SOCKET and returns the time until READY=1 arrives.
    func startTimingReady() throws -> (Child, Double) {
        let notifyPath = root + "/notify.sock"
        unlink(notifyPath)
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        defer { close(fd); unlink(notifyPath) }
        try Socket.bind(fd, notifyPath)
        var environment = self.environment
        environment["NOTIFY_SOCKET"] = notifyPath
        let start = Monotonic.now()
        let child = try Child.spawn(binary, [], environment: environment)
        var buffer = [UInt8](repeating: 0, count: 4096)
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        while true {
            let count = recv(fd, &buffer, buffer.count, 0)
            guard count > 0 else { throw BenchError("no READY=1 from brokerd") }
            if String(decoding: buffer[0..<count], as: UTF8.self).contains("READY=1") { break }
        }
        return (child, Monotonic.now() - start)
    }
}

/// A child process, stopped by PID and always waited for.
struct Child {
    let pid: pid_t

    static func spawn(_ path: String, _ arguments: [String], environment: [String: String]) throws -> Child {
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { (argv + envp).forEach { free($0) } }
        var pid: pid_t = 0
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        let result = posix_spawn(&pid, path, &actions, nil, argv, envp)
        guard result == 0 else { throw BenchError("cannot start \(path): \(String(cString: strerror(result)))") }
        return Child(pid: pid)
    }

    static func waitForSocket(_ path: String) throws {
        for _ in 0..<500 {
            if let fd = try? Socket.connect(path) {
                close(fd)
                return
            }
            usleep(10_000)
        }
        throw BenchError("nothing listens on \(path)")
    }

    func residentMiB() -> Double {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        let kib = Double(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
        return kib / 1024
    }

    func stop() {
        kill(pid, SIGTERM)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }
}

enum Socket {
    /// Sends one request line and returns the response line (blocking).
    static func exchange(_ fd: Int32, _ line: String) -> String {
        _ = Array((line + "\n").utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var response = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while response.last != 0x0A {
            let count = recv(fd, &buffer, buffer.count, 0)
            if count <= 0 { break }
            response += buffer[0..<count]
        }
        return String(decoding: response, as: UTF8.self)
    }

    static func connect(_ path: String) throws -> Int32 {
        guard case .success(let fd) = UnixSocketAddress.connect(path) else {
            throw BenchError("cannot connect to \(path)")
        }
        return fd
    }

    static func bind(_ fd: Int32, _ path: String) throws {
        guard UnixSocketAddress.withAddress(path, { Glibc.bind(fd, $0, $1) }) == 0 else {
            throw BenchError("cannot bind \(path)")
        }
    }
}

enum Monotonic {
    static func now() -> Double {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The floor: a SwiftNIO server on a Unix socket that writes back whatever it reads.
enum EchoServer {
    static func run(path: String) throws -> Never {
        unlink(path)
        let channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Echo()) }
            }
            .bind(unixDomainSocketPath: path).wait()
        try channel.closeFuture.wait()
        exit(0)
    }

    final class Echo: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.write(data, promise: nil)
        }

        func channelReadComplete(context: ChannelHandlerContext) { context.flush() }
    }
}
