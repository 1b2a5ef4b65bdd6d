import Foundation
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `broker-bench flood`: one local process floods the broker (a pipelining connection that
/// never reads, 500 half-sent lines, 10,000 subscriptions, 1,000 idle connections) while
/// another client asks for cached tokens. Prints the broker's resident memory and that
/// client's p50/p99 before and during the flood, next to the echo floor of the same run.
enum Flood {
    static func run(brokerd: String, seconds: Double) async throws {
        let workspace = try TemporaryDirectory()
        defer { workspace.remove() }
        let tokenLine = #"{"id":1,"op":"token","account":"bench-0"}"# + "\n"

        let echoPath = workspace.file("echo.sock")
        let echo = try ChildProcess.spawn(CommandLine.arguments[0], ["echo-server", echoPath], environment: [:])
        _ = try RawConnection(path: echoPath, waitingUpTo: 5)
        let floor = try Load.run(path: echoPath, line: tokenLine, clients: 1, seconds: seconds)
        echo.stop()

        let broker = try BrokerProcess(brokerd: brokerd)
        try await broker.start()
        defer { broker.stop() }
        try broker.addStaticAccounts(range: 0..<1)
        // The measured client keeps one connection, opened before the flood takes every slot.
        let client = try RawConnection(path: broker.socketPath)
        let before = try Load.run(on: [client], line: tokenLine, seconds: seconds)
        let residentBefore = broker.residentMiB

        let attack = try Attack(path: broker.socketPath)
        usleep(1_000_000)
        var residentDuring = broker.residentMiB
        let during = try Load.run(on: [client], line: tokenLine, seconds: seconds)
        residentDuring = max(residentDuring, broker.residentMiB)
        let report = attack.stop()

        print("flood from one process, held while the other client is measured:\n  \(report)")
        print("cached token requests from another client, 1 connection, \(Int(seconds)) s per run")
        print("run             p50 (us)  p99 (us)  req/s")
        for (name, result) in [("echo floor", floor), ("broker before", before), ("broker during", during)] {
            let label = name + String(repeating: " ", count: 14 - name.count)
            print(label + String(format: "  %8.1f  %8.1f  %7.0f", result.p50, result.p99, result.perSecond))
        }
        print(
            String(
                format: "resident memory: %.1f MiB before, %.1f MiB during, growth %.1f MiB (target < 32); "
                    + "p99 during %.2f ms (target < 10)",
                residentBefore, residentDuring, residentDuring - residentBefore, during.p99 / 1000))
    }
}

/// The flood itself, held open until `stop()`.
final class Attack: @unchecked Sendable {
    private let path: String
    /// The flood's connections by kind, in the order they were opened.
    private var held: [(kind: String, connections: [RawConnection])] = []
    private let pipeliner: RawConnection
    private let stopping = NSLock()
    private var stopped = false
    private var pipelinedBytes = 0
    private let pipelinerDone = DispatchSemaphore(value: 0)

    init(path: String) throws {
        self.path = path
        // A connection that pipelines cached-token requests and never reads an answer.
        pipeliner = try RawConnection(path: path)
        var timeout = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(pipeliner.descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        Thread { [self] in
            let chunk = Array(String(repeating: #"{"id":1,"op":"token","account":"bench-0"}"# + "\n", count: 100).utf8)
            while stopping.withLock({ !stopped }) {
                let sent = chunk.withUnsafeBytes {
                    send(pipeliner.descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                }
                if sent > 0 { stopping.withLock { pipelinedBytes += sent } }
                if sent < 0, errno != EAGAIN { break }
            }
            pipelinerDone.signal()
        }.start()

        // 500 connections, each holding a line just under the 64 KiB limit without its newline.
        let almostWhole = [UInt8](repeating: UInt8(ascii: "a"), count: 65535)
        try hold("half-sent 64 KiB lines", count: 500, sending: almostWhole)
        // 10,000 subscriptions: 100 connections asking for 100 each, never reading.
        let subscribes = Array(String(repeating: #"{"id":1,"op":"subscribe"}"# + "\n", count: 100).utf8)
        try hold("connections asking for 100 subscriptions", count: 100, sending: subscribes)
        // 1,000 connections that say nothing.
        try hold("idle connections", count: 1000, sending: [])
    }

    private func hold(_ kind: String, count: Int, sending bytes: [UInt8]) throws {
        var connections: [RawConnection] = []
        for _ in 0..<count {
            let connection = try RawConnection(path: path)
            var timeout = timeval(tv_sec: 1, tv_usec: 0)
            setsockopt(connection.descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            if !bytes.isEmpty {
                _ = bytes.withUnsafeBytes { send(connection.descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
            connections.append(connection)
        }
        held.append((kind, connections))
    }

    /// Ends the flood and says what the broker made of it.
    func stop() -> String {
        stopping.withLock { stopped = true }
        pipelinerDone.wait()
        let pipelined = stopping.withLock { pipelinedBytes }
        var lines = [
            "a connection pipelining cached-token requests, never reading: \(pipelined / 1024) KiB sent "
                + "before the broker stopped reading (socket buffers included)"
        ]
        for (kind, connections) in held {
            let answeredBusy = connections.map(\.descriptor).filter(Self.gotBusy).count
            lines.append("\(connections.count) \(kind): \(answeredBusy) answered busy (over a limit)")
        }
        held = []
        return lines.joined(separator: "\n  ")
    }

    /// Whether the broker sent `busy` on this connection (a refusal, or a request over a limit).
    private static func gotBusy(_ fd: Int32) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 65536)
        var seen = Data()
        while true {
            let count = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            guard count > 0 else { break }
            seen.append(contentsOf: buffer[0..<count])
        }
        return seen.range(of: Data(#""code":"busy""#.utf8)) != nil
    }
}
