import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A service manager that does not read its notification socket (busy with a daemon-reload,
/// say): brokerd's `STATUS=` and watchdog pings wait on a thread of their own, and no client
/// and no shutdown waits for them. Real brokerd; a datagram socket this test never reads.
@Suite struct UnreadNotifySocketTests {
    @Test func aManagerThatNeverReadsStallsNoClientAndNoExit() async throws {
        let broker = try BrokerProcess()
        let notify = try DatagramListener(path: broker.root.appendingPathComponent("notify.sock").path)
        #expect(try Self.fill(notify.path) > 0, "the manager's queue is full before brokerd starts")
        try await broker.start(environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000"])
        // 10,000 requests: 2,000 adds (each changes the summary, so each is a STATUS=), each
        // followed by four tokens of the account it added. Off the cooperative pool: each read waits.
        let served = try await onOwnThread { () throws -> Int in
            let connection = try RawConnection(path: broker.socketPath, readTimeout: 10)
            var served = 0
            for index in 0..<2000 {
                let added = connection.request(
                    #"{"id":1,"op":"add","account":"a\#(index)","provider":{"kind":"static"},"#
                        + #""tokens":{"access_token":"at-\#(index)","expires_in":3600}}"#)
                guard added?.contains(#""ok":true"#) == true else { break }
                served += 1
                for _ in 0..<4 {
                    let token = connection.request(#"{"id":2,"op":"token","account":"a\#(index)"}"#)
                    guard token?.contains(#""access_token":"at-\#(index)""#) == true else { return served }
                    served += 1
                }
            }
            return served
        }
        #expect(served == 10000, "every add and token answered")
        let signalled = ContinuousClock.now
        let status = broker.stop()
        let took = signalled.duration(to: .now)
        #expect(status == 0)
        // A bound, not a speed figure: a blocked sd_notify would hold the exit for good.
        #expect(took < .seconds(1), "brokerd exited \(took) after SIGTERM")
    }

    /// Sends datagrams to `path` until its queue is full; how many it took.
    static func fill(_ path: String) throws -> Int {
        let sender = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard sender >= 0 else { throw HarnessError("socket: errno \(errno)") }
        defer { close(sender) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8) + [0]) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(sender, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard connected == 0 else { throw HarnessError("connect \(path): errno \(errno)") }
        var sent = 0
        while send(sender, "STATUS=filler", 13, Int32(MSG_DONTWAIT)) == 13 { sent += 1 }
        guard errno == EAGAIN else { throw HarnessError("send: errno \(errno)") }
        return sent
    }
}
