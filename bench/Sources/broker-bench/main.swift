import BrokerProtocol
import Foundation
import NIOCore
import NIOPosix
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

// broker-bench: the figures of docs/performance.md, each next to its yardstick measured in the same run
// (Figures.swift, printed as a table by Table.swift), `broker-bench save`: durable saves with
// 1,000 accounts (VaultSave.swift), `broker-bench idle`: an idle broker's wake-ups
// (IdleWakeups.swift), and `broker-bench flood`: the latency of cached tokens
// while one process floods the broker (Flood.swift), and `broker-bench fleet`: what sharing an
// account through the fleet's PostgreSQL store costs (FleetBench.swift), and `broker-bench soak`:
// minutes of rotations through outages, kills and a full disk (Soak.swift, run by bench/soak), and
// `broker-bench changes`: one account's `add`, `set_tokens` and `remove` beside thousands (ChangesBench.swift).
// Run it through bench/run (release build).

let usage = """
    usage: broker-bench figures PATH-TO-BROKERD PATH-TO-LOAD-CLIENT PATH-TO-ECHO-SERVER [SECONDS-PER-LOAD-RUN]
           broker-bench policy PATH-TO-BROKERD PATH-TO-LOAD-CLIENT [SECONDS-PER-LOAD-RUN]
           broker-bench dpop PATH-TO-BROKERD PATH-TO-LOAD-CLIENT [SECONDS-PER-LOAD-RUN]
           broker-bench fresh PATH-TO-BROKERD
           broker-bench fleet PATH-TO-BROKERD PATH-TO-LOAD-CLIENT [SECONDS-PER-LOAD-RUN]
           broker-bench idle PATH-TO-BROKERD [SECONDS]
           broker-bench save
           broker-bench changes PATH-TO-BROKERD
           broker-bench soak PATH-TO-BROKERD MINUTES
           broker-bench table < FIGURES
           broker-bench flood PATH-TO-BROKERD [SECONDS-PER-RUN]
           broker-bench echo-server SOCKET [EVENT-LOOPS] [ANSWER-BYTES]

    """
let arguments = CommandLine.arguments
if arguments.count >= 3, arguments[1] == "echo-server" {
    // An optional event-loop count, 1 to 64 (default: one per core), and answer size, 32 to 65,536.
    let loops = arguments.count >= 4 ? Int(arguments[3]).flatMap { (1...64).contains($0) ? $0 : nil } : nil
    let bytes = arguments.count >= 5 ? Int(arguments[4]).flatMap { (32...65536).contains($0) ? $0 : nil } : nil
    try EchoServer.run(path: arguments[2], eventLoops: loops, answerBytes: bytes ?? 200)
}
var fileLimit = rlimit()
getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &fileLimit)
fileLimit.rlim_cur = fileLimit.rlim_max
setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &fileLimit)

/// The seconds per load run given at `index` of the arguments, or `fallback`: 0.5 to 30 (a
/// number read from the command line is checked before it sets a deadline).
func seconds(at index: Int, default fallback: Double) throws -> Double {
    let arguments = CommandLine.arguments
    let seconds = arguments.count > index ? Double(arguments[index]) ?? fallback : fallback
    guard (0.5...30).contains(seconds) else { throw BenchError("seconds per load run: 0.5 to 30") }
    return seconds
}

do {
    switch arguments.count >= 2 ? arguments[1] : "" {
    case "flood" where arguments.count >= 3:
        try await Flood.run(brokerd: arguments[2], seconds: try seconds(at: 3, default: 3))
    case "figures" where arguments.count >= 5:
        let tools = Figures.Tools(brokerd: arguments[2], loadClient: arguments[3], echoServer: arguments[4])
        try await Figures(tools: tools, secondsPerLoad: try seconds(at: 5, default: 2)).run()
    case "policy" where arguments.count >= 4:
        let tools = Figures.Tools(brokerd: arguments[2], loadClient: arguments[3], echoServer: "")
        try await Figures(tools: tools, secondsPerLoad: try seconds(at: 4, default: 2)).runPolicy()
    case "dpop" where arguments.count >= 4:
        let tools = Figures.Tools(brokerd: arguments[2], loadClient: arguments[3], echoServer: "")
        try await Figures(tools: tools, secondsPerLoad: try seconds(at: 4, default: 2)).runDPoP()
    case "fleet" where arguments.count >= 4:
        let tools = Figures.Tools(brokerd: arguments[2], loadClient: arguments[3], echoServer: "")
        try await FleetBench(figures: Figures(tools: tools, secondsPerLoad: try seconds(at: 4, default: 2))).run()
    case "fresh" where arguments.count >= 3:
        let tools = Figures.Tools(brokerd: arguments[2], loadClient: "", echoServer: "")
        try await Figures(tools: tools, secondsPerLoad: 2).runFresh()
    case "idle" where arguments.count >= 3:
        let seconds = arguments.count > 3 ? UInt32(arguments[3]).flatMap { (1...600).contains($0) ? $0 : nil } : 60
        guard let seconds else { throw BenchError("idle seconds: 1 to 600") }
        try await IdleWakeups.run(brokerd: arguments[2], seconds: seconds)
    case "soak" where arguments.count >= 4:
        guard let minutes = Int(arguments[3]), (1...1440).contains(minutes) else {
            throw BenchError("soak minutes: 1 to 1440")
        }
        try await Soak(brokerd: arguments[2], minutes: minutes).run()
    case "save":
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try VaultSaveBench.run(directory: directory.path)
    case "changes" where arguments.count >= 3:
        try await ChangesBench.run(brokerd: arguments[2])
    case "table":
        Table.printTable(figures: Table.readFigures())
    default:
        FileHandle.standardError.write(Data(usage.utf8))
        exit(2)
    }
} catch {
    FileHandle.standardError.write(Data("broker-bench: \(error)\n".utf8))
    exit(1)
}

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
        let connections = try (0..<clients).map { _ in try RawConnection(path: path) }
        return try run(on: connections, line: line, seconds: seconds)
    }

    /// The same on connections opened beforehand (each with nothing in flight).
    static func run(on connections: [RawConnection], line: String, seconds: Double) throws -> LoadResult {
        let descriptors = connections.map(\.descriptor)
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

/// What the figures ask of the real brokerd, over its socket.
extension BrokerProcess {
    /// Adds `bench-N` static accounts over the socket, one at a time, each holding an 800-byte
    /// token (the size of a realistic JWT).
    func addStaticAccounts(range: Range<Int>) throws {
        let connection = try RawConnection(path: socketPath)
        for index in range {
            let prefix = "bench-token-\(index)-"
            let token = prefix + String(repeating: "x", count: 800 - prefix.utf8.count)
            let answer = connection.request(
                #"{"id":\#(index),"op":"add","account":"bench-\#(index)","provider":{"kind":"static"},"tokens":{"access_token":"\#(token)","expires_in":86400}}"#
            )
            guard let answer, answer.contains(#""ok":true"#) else {
                throw BenchError("adding account \(index) failed: \(answer ?? "no answer")")
            }
        }
    }

    /// Adds a DPoP `oauth2` account (`dpop = "ES256"`) holding an 800-byte access token valid
    /// for a day, so that no IdP is called: what a `token` with `dpop` costs is the proof.
    func addDPoPAccount(name: String) throws {
        let token = "bench-dpop-" + String(repeating: "x", count: 789)
        let answer = try RawConnection(path: socketPath).request(
            #"{"id":1,"op":"add","account":"\#(name)","provider":{"kind":"oauth2","token_endpoint":"https://idp.example/token","client_id":"bench","dpop":"ES256"},"tokens":{"access_token":"\#(token)","token_type":"DPoP","expires_in":86400}}"#
        )
        guard let answer, answer.contains(#""ok":true"#) else {
            throw BenchError("adding the DPoP account failed: \(answer ?? "no answer")")
        }
    }

    /// Adds an `oauth2` account and waits for its first token.
    func addOAuth2Account(name: String, endpoint: String, clientID: String, refreshToken: String) throws {
        let connection = try RawConnection(path: socketPath)
        let add =
            #"{"id":1,"op":"add","account":"\#(name)","provider":{"kind":"oauth2","token_endpoint":"\#(endpoint)","client_id":"\#(clientID)"},"tokens":{"refresh_token":"\#(refreshToken)"}}"#
        let token = #"{"id":2,"op":"token","account":"\#(name)"}"#
        for line in [add, token] {
            guard connection.request(line)?.contains(#""ok":true"#) == true else {
                throw BenchError("cannot set up \(name)")
            }
        }
    }

    /// Every one of `clients` (open connections, each with nothing in flight) rejects the
    /// current token at once; returns when the first and the last of them holds the replacement.
    func rejectLatency(account: String, clients: [RawConnection]) throws -> FreshTokenTimes {
        let current =
            try RawConnection(path: socketPath).request(
                #"{"id":0,"op":"token","account":"\#(account)","min_ttl":0}"#) ?? ""
        guard let range = current.range(of: #""access_token":""#),
            let end = current[range.upperBound...].firstIndex(of: "\"")
        else { throw BenchError("no token for \(account)") }
        let token = String(current[range.upperBound..<end])
        let request = #"{"id":1,"op":"reject","account":"\#(account)","access_token":"\#(token)"}"#
        return try freshTokenLatency(request: request, start: WallClock.now(), on: clients)
    }

    /// The account's token expires (pushed as expired, with the IdP's current refresh token);
    /// then every one of `clients` (open connections, each with nothing in flight) asks for a
    /// token. Returns when the token expired and when the first and the last of them held a
    /// fresh one.
    func expiredLatency(account: String, clients: [RawConnection], refreshToken: String) throws
        -> FreshTokenTimes
    {
        let admin = try RawConnection(path: socketPath)
        let start = WallClock.now()
        let pushed = admin.request(
            #"{"id":0,"op":"set_tokens","account":"\#(account)","tokens":{"access_token":"expired","expires_at":"2000-01-01T00:00:00Z","refresh_token":"\#(refreshToken)"}}"#
        )
        guard pushed?.contains(#""ok":true"#) == true else { throw BenchError("set_tokens failed") }
        let request = #"{"id":1,"op":"token","account":"\#(account)","min_ttl":60}"#
        return try freshTokenLatency(request: request, start: start, on: clients)
    }

    /// Sends `request` on every one of `clients` and returns when the first and the last
    /// successful answer arrived. The first is seen by one poll(2) over every client, set up
    /// before any answer comes; then each client's answer is read in turn (a read waits 10 s at
    /// most) into one buffer, and the last is when all have been read: an upper bound that
    /// costs the bench one read per answer. Polling the clients still waiting after every
    /// wake-up, and a 64 KiB buffer zeroed per answer, cost the bench milliseconds with 1,000.
    private func freshTokenLatency(request: String, start: Double, on clients: [RawConnection]) throws
        -> FreshTokenTimes
    {
        for client in clients { client.send(request + "\n") }
        var polls = clients.map { pollfd(fd: $0.descriptor, events: Int16(POLLIN), revents: 0) }
        var ready: Int32
        repeat { ready = poll(&polls, nfds_t(polls.count), 10_000) } while ready < 0 && errno == EINTR
        guard ready > 0 else { throw BenchError("token answers timed out") }
        var times = FreshTokenTimes(start: start, first: WallClock.now(), last: 0)
        var line = LineReader()
        for client in clients {
            guard line.read(from: client.descriptor) else { throw BenchError("no answer") }
            guard line.contains(#""ok":true"#) else { throw BenchError("no fresh token: \(line.text)") }
        }
        times.last = WallClock.now()
        return times
    }

    /// Starts brokerd with a NOTIFY_SOCKET and returns the time until READY=1 arrives.
    func startTimingReady() async throws -> Double {
        let notify = try DatagramListener(path: root.appendingPathComponent("notify.sock").path)
        let start = Monotonic.now()
        try await startWithNotifySocket(notify.path)
        while true {
            guard let message = notify.receive(timeout: 10) else { throw BenchError("no READY=1 from brokerd") }
            if message.contains("READY=1") { return Monotonic.now() - start }
        }
    }

    /// The running broker's resident memory in MiB (0 when it cannot be read).
    var residentMiB: Double { Double((try? residentKiB()) ?? 0) / 1024 }
}

/// Reads one answer line at a time into one buffer kept for every connection, so that the
/// bench's reading costs no allocation per answer.
struct LineReader {
    private var buffer = [UInt8](repeating: 0, count: 65536)
    private var length = 0

    /// Reads from `descriptor` until a newline has come (the broker answers a token request with
    /// one line and nothing after it); `false` when the connection ends first.
    mutating func read(from descriptor: Int32) -> Bool {
        length = 0
        while length < buffer.count {
            let count = buffer.withUnsafeMutableBytes {
                recv(descriptor, $0.baseAddress! + length, $0.count - length, 0)
            }
            guard count > 0 else { return false }
            length += count
            if buffer[length - count..<length].contains(0x0A) { return true }
        }
        return false
    }

    /// Whether the line read contains `text`.
    func contains(_ text: String) -> Bool {
        buffer[..<length].firstRange(of: Array(text.utf8)) != nil
    }

    /// The line read, for an error message.
    var text: String { String(decoding: buffer[..<length], as: UTF8.self) }
}

/// When a fresh token reached waiting clients: wall-clock seconds since 1970, the clock the
/// test IdP stamps its calls with.
struct FreshTokenTimes {
    /// When the old token was pushed expired (or rejected).
    var start: Double
    var first: Double
    var last: Double
}

enum WallClock {
    static func now() -> Double {
        var spec = timespec()
        clock_gettime(CLOCK_REALTIME, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
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

/// SwiftNIO's floor: a server on a Unix socket that writes back whatever it reads, on
/// `eventLoops` event loops (one per core when `nil`).
/// `broker-bench echo-server PATH [LOOPS] [BYTES]`: the C echo floor's behaviour in SwiftNIO, with
/// brokerd's channel options and nothing else: every line received is answered with one fixed
/// line of `BYTES` bytes (default 200, the C floor's) that holds `"access_token"`. Measured
/// beside brokerd with the size of its answer, it shows what SwiftNIO alone costs per request.
enum EchoServer {
    static func run(path: String, eventLoops: Int?, answerBytes: Int) throws -> Never {
        unlink(path)
        let group = eventLoops.map { MultiThreadedEventLoopGroup(numberOfThreads: $0) } ?? .singleton
        let answer = ByteBuffer(bytes: Self.answer(bytes: answerBytes))
        let channel = try ServerBootstrap(group: group)
            .childChannelOption(.maxMessagesPerRead, value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(FixedAnswer(answer: answer))
                }
            }
            .bind(unixDomainSocketPath: path).wait()
        try channel.closeFuture.wait()
        exit(0)
    }

    /// `{"ok":true,"access_token":"xx…"}` and a newline, `bytes` long (at least 32).
    static func answer(bytes: Int) -> [UInt8] {
        let head = Array(#"{"ok":true,"access_token":""#.utf8)
        let tail = Array("\"}\n".utf8)
        return head + [UInt8](repeating: UInt8(ascii: "x"), count: max(0, bytes - head.count - tail.count)) + tail
    }

    final class FixedAnswer: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        private let answer: ByteBuffer
        private var written = false

        init(answer: ByteBuffer) { self.answer = answer }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            for byte in unwrapInboundIn(data).readableBytesView where byte == UInt8(ascii: "\n") {
                context.write(wrapOutboundOut(answer), promise: nil)
                written = true
            }
        }

        func channelReadComplete(context: ChannelHandlerContext) {
            guard written else { return }
            written = false
            context.flush()
        }
    }
}
