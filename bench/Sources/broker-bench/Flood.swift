import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `broker-bench flood`: one local process floods the broker (a pipelining connection that
/// never reads, 500 half-sent lines, 10,000 subscriptions, 1,000 idle connections) while
/// another client asks for cached tokens. Prints the broker's resident memory and that
/// client's p50/p99 before and during the flood, next to the echo floor of the same run.
enum Flood {
    static func run(brokerd: String, seconds: Double) throws {
        let workspace = "/tmp/tb-flood-\(getpid())"
        defer { try? FileManager.default.removeItem(atPath: workspace) }
        try FileManager.default.createDirectory(atPath: workspace, withIntermediateDirectories: true)
        let tokenLine = #"{"id":1,"op":"token","account":"bench-0"}"# + "\n"

        let echoPath = workspace + "/echo.sock"
        let echo = try Child.spawn(CommandLine.arguments[0], ["echo-server", echoPath], environment: [:])
        try Child.waitForSocket(echoPath)
        let floor = try Load.run(path: echoPath, line: tokenLine, clients: 1, seconds: seconds)
        echo.stop()

        let broker = BrokerUnderTest(binary: brokerd, root: workspace + "/broker")
        let process = try broker.start()
        defer { process.stop() }
        try broker.addStaticAccounts(range: 0..<1)
        let before = try Load.run(path: broker.socketPath, line: tokenLine, clients: 1, seconds: seconds)
        let residentBefore = process.residentMiB()

        let attack = try Attack(path: broker.socketPath)
        usleep(1_000_000)
        var residentDuring = process.residentMiB()
        let during = try Load.run(path: broker.socketPath, line: tokenLine, clients: 1, seconds: seconds)
        residentDuring = max(residentDuring, process.residentMiB())
        let report = attack.stop()

        print("flood from one process: \(report)")
        print("cached token requests from another client, 1 connection, \(Int(seconds)) s per run")
        print("run             p50 (us)  p99 (us)  req/s")
        for (name, result) in [("echo floor", floor), ("broker before", before), ("broker during", during)] {
            print(String(format: "%-14@  %8.1f  %8.1f  %7.0f", name as NSString, result.p50, result.p99, result.perSecond))
        }
        print(
            String(
                format: "resident memory: %.1f MiB before, %.1f MiB during, growth %.1f MiB (target < 32); p99 during %.2f ms (target < 10)",
                residentBefore, residentDuring, residentDuring - residentBefore, during.p99 / 1000))
    }
}

/// The flood itself, held open until `stop()`.
final class Attack: @unchecked Sendable {
    private let path: String
    private var held: [Int32] = []
    private let pipeliner: Int32
    private let stopping = NSLock()
    private var stopped = false
    private var pipelinedBytes = 0
    private let pipelinerDone = DispatchSemaphore(value: 0)

    init(path: String) throws {
        self.path = path
        // A connection that pipelines cached-token requests and never reads an answer.
        pipeliner = try Socket.connect(path)
        var timeout = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(pipeliner, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        Thread { [self] in
            let chunk = Array(String(repeating: #"{"id":1,"op":"token","account":"bench-0"}"# + "\n", count: 100).utf8)
            while stopping.withLock({ !stopped }) {
                let sent = chunk.withUnsafeBytes { send(pipeliner, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if sent > 0 { stopping.withLock { pipelinedBytes += sent } }
                if sent < 0, errno != EAGAIN { break }
            }
            pipelinerDone.signal()
        }.start()

        // 500 connections, each holding a line just under the 64 KiB limit without its newline.
        let almostWhole = [UInt8](repeating: UInt8(ascii: "a"), count: 65535)
        for _ in 0..<500 { try hold(sending: almostWhole) }
        // 10,000 subscriptions: 100 connections asking for 100 each, never reading.
        let subscribes = Array(String(repeating: #"{"id":1,"op":"subscribe"}"# + "\n", count: 100).utf8)
        for _ in 0..<100 { try hold(sending: subscribes) }
        // 1,000 connections that say nothing.
        for _ in 0..<1000 { try hold(sending: []) }
    }

    private func hold(sending bytes: [UInt8]) throws {
        let fd = try Socket.connect(path)
        var timeout = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        if !bytes.isEmpty { _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }
        held.append(fd)
    }

    /// Ends the flood and says what the broker made of it.
    func stop() -> String {
        stopping.withLock { stopped = true }
        pipelinerDone.wait()
        var refused = 0
        var closed = 0
        var buffer = [UInt8](repeating: 0, count: 65536)
        for fd in held {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 0) > 0 else { continue }
            let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count <= 0 {
                closed += 1
            } else if String(decoding: buffer[0..<count], as: UTF8.self).contains(#""code":"busy""#) {
                refused += 1
            }
        }
        let pipelined = stopping.withLock { pipelinedBytes }
        (held + [pipeliner]).forEach { close($0) }
        return "\(held.count + 1) connections; \(refused) answered busy (a limit), \(closed) more closed; "
            + "the never-reading connection got \(pipelined / 1024) KiB of requests in"
    }
}
