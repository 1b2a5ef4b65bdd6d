import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A TCP proxy between the brokers of a test fleet and their IdP, one listener per host (so it
/// knows which host each request comes from), that can hold one request before the IdP sees it,
/// or the IdP's answer before the broker sees it: the instants at which a test makes a fault
/// (the lease holder killed before its IdP call, or after the IdP rotated the credential but
/// before the broker knew). Each connection carries one request (gunicorn's sync workers close
/// after each answer). Blocking sockets on threads of their own; `stop` closes the listeners and
/// waits for every thread.
public final class TokenEndpointProxy: Sendable {
    /// Where the next request is held.
    public enum HoldPoint: Sendable {
        /// Before the IdP sees it; dropped on release if its broker has gone meanwhile.
        case request
        /// After the IdP answered, before the broker sees the answer.
        case answer
    }

    private struct State {
        var stopped = false
        var threads = 0
        /// Requests seen from each host.
        var requests: [Int]
        /// Where the next request is to be held, if it is.
        var holdNext: HoldPoint?
        /// The host whose request or answer is held, while it is.
        var heldHost: Int?
        /// Whether the held request or answer may go on.
        var released = false
    }

    private let listeners: [Int32]
    private let upstream: sockaddr_in
    private let state: Mutex<State>

    /// Forwards what each of `listeners` (host 0, 1, ...) accepts to `address`:`port`.
    public init(listeners: [Int32], upstreamAddress address: String, port: Int) {
        self.listeners = listeners
        var upstream = sockaddr_in()
        upstream.sin_family = sa_family_t(AF_INET)
        upstream.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, address, &upstream.sin_addr)
        self.upstream = upstream
        state = Mutex(State(requests: Array(repeating: 0, count: listeners.count)))
        for (host, listener) in listeners.enumerated() {
            spawn { self.accept(on: listener, host: host) }
        }
    }

    /// Requests seen from each host so far.
    public var requests: [Int] { state.withLock { $0.requests } }

    /// Holds the next request, or its answer, until `release`.
    public func holdNext(_ point: HoldPoint) { state.withLock { $0.holdNext = point } }

    /// Waits (up to `seconds`) until a request or answer is held; returns the host it is for,
    /// which holds the lease while its refresh is held.
    public func waitForHeld(seconds: Double) async throws -> Int {
        guard await eventually(timeout: seconds, { state.withLock { $0.heldHost } != nil }),
            let host = state.withLock({ $0.heldHost })
        else { throw HarnessError("no request held within \(seconds) s") }
        return host
    }

    /// Lets the held request or answer go on (a request whose broker has gone is dropped; an
    /// answer to a broker gone is lost).
    public func release() {
        state.withLock {
            $0.holdNext = nil
            $0.released = true
        }
    }

    /// Closes the listeners and waits (up to 30 s) for every connection's thread.
    public func stop() {
        let first = state.withLock { state in
            defer {
                state.stopped = true
                state.released = true
            }
            return !state.stopped
        }
        if first { for listener in listeners { shutdown(listener, Int32(SHUT_RDWR)) } }
        _ = Poll.blocking(timeout: 30) { state.withLock { $0.threads } == 0 }
        if first { for listener in listeners { close(listener) } }
    }

    private func spawn(_ body: @escaping @Sendable () -> Void) {
        state.withLock { $0.threads += 1 }
        Thread {
            body()
            self.state.withLock { $0.threads -= 1 }
        }.start()
    }

    private var stopped: Bool { state.withLock { $0.stopped } }

    private func accept(on listener: Int32, host: Int) {
        while !stopped {
            var poller = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 100) > 0 else { continue }
            let client = Glibc.accept(listener, nil, nil)
            guard client >= 0 else { continue }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            spawn { self.carry(client, host: host) }
        }
    }

    /// Carries one connection both ways until either side closes it.
    private func carry(_ client: Int32, host: Int) {
        defer { close(client) }
        let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard server >= 0 else { return }
        defer { close(server) }
        var address = upstream
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { return }
        var counted = false
        var holding: HoldPoint?
        var answered = false
        var buffer = [UInt8](repeating: 0, count: 65536)
        while !stopped {
            var pollers = [
                pollfd(fd: client, events: Int16(POLLIN), revents: 0),
                pollfd(fd: server, events: Int16(POLLIN), revents: 0),
            ]
            guard poll(&pollers, 2, 100) > 0 else { continue }
            if pollers[0].revents != 0 {
                let count = read(client, &buffer, buffer.count)
                guard count > 0 else { return }
                if !counted {
                    counted = true
                    holding = state.withLock { state in
                        state.requests[host] += 1
                        defer { state.holdNext = nil }
                        return state.holdNext
                    }
                    if holding == .request {
                        hold(host: host)
                        guard !Self.hasClosed(client) else { return }
                    }
                }
                guard Self.writeAll(server, buffer, count) else { return }
            }
            if pollers[1].revents != 0 {
                let count = read(server, &buffer, buffer.count)
                guard count > 0 else { return }
                if holding == .answer, !answered {
                    answered = true
                    hold(host: host)
                }
                // A broker killed meanwhile: the answer is lost, as the fault means it to be.
                guard Self.writeAll(client, buffer, count) else { return }
            }
        }
    }

    /// Waits until the test releases what is held for `host` (or stops the proxy), 60 s at most.
    private func hold(host: Int) {
        state.withLock {
            $0.heldHost = host
            $0.released = false
        }
        _ = Poll.blocking(timeout: 60, every: .milliseconds(2)) { state.withLock { $0.released } }
        state.withLock { $0.heldHost = nil }
    }

    /// Whether the peer of `descriptor` has closed its end (a killed broker's socket).
    private static func hasClosed(_ descriptor: Int32) -> Bool {
        var byte: UInt8 = 0
        let count = recv(descriptor, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        return count == 0 || (count < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
    }

    private static func writeAll(_ descriptor: Int32, _ buffer: [UInt8], _ count: Int) -> Bool {
        var offset = 0
        while offset < count {
            let written = buffer.withUnsafeBytes {
                send(descriptor, $0.baseAddress! + offset, count - offset, Int32(MSG_NOSIGNAL))
            }
            guard written > 0 else { return false }
            offset += written
        }
        return true
    }
}
