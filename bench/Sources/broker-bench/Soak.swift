import Foundation
import Synchronization
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `broker-bench soak`: the broker against the test IdP (every refresh rotates the refresh token;
/// a used one is refused and counted, as an IdP with reuse detection does) for a number of
/// minutes, with clients asking all the time, through what breaks chains elsewhere. Each minute:
/// - 0 to 15 s: calm;
/// - 15 to 25 s: the IdP answers 503 (an outage);
/// - 30 s: brokerd is killed with SIGKILL and started again;
/// - 40 to 50 s: the state directory (a tmpfs of its own) is full to the last byte, and at 45 s
///   brokerd is killed and started again while it is.
/// Then it prints tokens served, refreshes, IdP calls per rotation, reuse detections, expired
/// tokens served and credentials lost (docs/performance.md), each beside its floor. Needs root
/// for the tmpfs; without it the full disk is left out, and it says so.
struct Soak {
    let brokerd: String
    let minutes: Int
    /// Seconds an access token lives: short, so that each minute holds several rotations.
    static let lifetime = 8
    /// Clients asking all the time, each on a thread of its own.
    static let clients = 8

    /// What the clients saw, and whether they are to stop and have stopped.
    private final class Clients: Sendable {
        struct Served {
            var tokens = 0
            var expired = 0
            var refusals = 0
        }
        let served = Mutex(Served())
        let stop = Atomic<Bool>(false)
        let finished = Atomic<Int>(0)
    }

    func run() async throws {
        let idp = try await OAuth2TestIdP(initialRefreshToken: "rt-soak", lifetime: Self.lifetime)
        let broker = try BrokerProcess(brokerd: brokerd)
        let state = broker.stateDirectory.path
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
        let mounted = Self.mountTmpfs(at: state)
        defer { if mounted { Self.unmount(state) } }
        try await broker.start()
        defer { broker.stop() }
        let added = try await broker.brokerctl(
            [
                "add", "soak", "--kind", "oauth2", "--token-endpoint", idp.tokenEndpoint, "--client-id", idp.clientID,
                "--secrets", "-",
            ],
            stdin: #"{"refresh_token": "rt-soak", "client_secret": "\#(idp.clientSecret)"}"#)
        guard added.status == 0 else { throw BenchError("brokerctl add failed: \(added.stderr)") }

        let clients = Clients()
        let socket = broker.socketPath
        let threads = (0..<Self.clients).map { _ in
            Thread {
                var connection: RawConnection?
                defer { clients.finished.add(1, ordering: .releasing) }
                while !clients.stop.load(ordering: .relaxed) {
                    if connection == nil { connection = try? RawConnection(path: socket, readTimeout: 5) }
                    guard let open = connection,
                        let answer = open.request(#"{"id":1,"op":"token","account":"soak","min_ttl":1}"#)
                    else {
                        connection = nil
                        usleep(50_000)
                        continue
                    }
                    let received = Date()
                    let token = Self.accessToken(in: answer)
                    clients.served.withLock { served in
                        guard let token else {
                            served.refusals += 1
                            return
                        }
                        served.tokens += 1
                        if !idp.accepted(token, at: received, grace: 0) { served.expired += 1 }
                    }
                    usleep(token == nil ? 50_000 : 2_000)
                }
            }
        }
        for thread in threads { thread.start() }
        var needsLoginSeen = 0
        let filler = state + "/filler"
        for minute in 0..<minutes {
            let start = Monotonic.now()
            for second in 0..<60 {
                switch second {
                case 15: idp.setBehavior(.status(503, retryAfter: nil))
                case 25: idp.setBehavior(.normal)
                case 30:
                    broker.crash()
                    try await broker.start()
                case 40 where mounted: try Self.fill(filler)
                case 45:
                    broker.crash()
                    try await broker.start()
                case 50 where mounted: unlink(filler)
                default: break
                }
                if Self.state(of: broker) == "needs_login" { needsLoginSeen += 1 }
                let next = start + Double(second + 1)
                let wait = next - Monotonic.now()
                if wait > 0 { usleep(UInt32(wait * 1_000_000)) }
            }
            Self.progress("minute \(minute + 1) of \(minutes): \(clients.served.withLock { $0.tokens }) tokens served")
        }
        clients.stop.store(true, ordering: .relaxed)
        // Each client ends within a read's timeout.
        while clients.finished.load(ordering: .acquiring) < Self.clients { usleep(10_000) }

        // Lost: the account cannot refresh any more (its refresh token is not the IdP's current one).
        let forced = try await broker.brokerctl(["refresh", "soak"])
        let lost = forced.status == 0 && Self.state(of: broker) == "valid" ? 0 : 1
        let calls = idp.refreshCalls
        let rotations = calls.filter(\.presentedCurrent).count
        let figures = clients.served.withLock { $0 }
        let perRotation = rotations == 0 ? Double.infinity : Double(calls.count) / Double(rotations)
        print(
            """
            soak: \(minutes) minute(s), \(Self.clients) clients, tokens living \(Self.lifetime) s; each minute an IdP \
            outage (10 s), 2 SIGKILLs of brokerd, \(mounted ? "a full disk (10 s)" : "no full disk (the tmpfs needs root)")
            | figure | this run | floor |
            |---|---|---|
            | tokens served | \(figures.tokens) (\(figures.refusals) answers without a token) | |
            | refreshes (IdP calls) | \(calls.count) | |
            | rotations | \(rotations) | |
            | IdP calls per rotation | \(String(format: "%.2f", perRotation)) | 1 |
            | reuse detections | \(idp.rejectedReuse) | 0 |
            | expired tokens served | \(figures.expired) | 0 |
            | credentials lost | \(lost) (needs_login seen \(needsLoginSeen) s) | 0 |
            """)
        if idp.rejectedReuse > 0 || figures.expired > 0 || lost > 0 || needsLoginSeen > 0 {
            throw BenchError("the soak lost or reused a credential, or served an expired token")
        }
        await idp.shutdown()
    }

    /// The access token of a `token` answer, or nil when it holds none.
    private static func accessToken(in answer: String) -> String? {
        guard let object = try? JSONSerialization.jsonObject(with: Data(answer.utf8)) as? [String: Any],
            object["ok"] as? Bool == true
        else { return nil }
        return (object["result"] as? [String: Any])?["access_token"] as? String
    }

    /// The account's state as `status` shows it, or nil while the broker does not answer.
    private static func state(of broker: BrokerProcess) -> String? {
        guard let connection = try? RawConnection(path: broker.socketPath, readTimeout: 5),
            let answer = connection.request(#"{"id":1,"op":"status"}"#),
            let object = try? JSONSerialization.jsonObject(with: Data(answer.utf8)) as? [String: Any],
            let accounts = (object["result"] as? [String: Any])?["accounts"] as? [[String: Any]]
        else { return nil }
        return accounts.first?["state"] as? String
    }

    /// Fills the filesystem of `path` to the last byte with the file `path`.
    private static func fill(_ path: String) throws {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { throw BenchError("cannot create \(path): errno \(errno)") }
        defer { close(descriptor) }
        let chunk = [UInt8](repeating: 0xA5, count: 65536)
        for size in [65536, 4096, 1] {
            while chunk.withUnsafeBytes({ write(descriptor, $0.baseAddress, size) }) == size {}
        }
        fsync(descriptor)
    }

    /// Mounts a 4 MiB tmpfs at `path` (root only); whether it did.
    private static func mountTmpfs(at path: String) -> Bool {
        let mounted = try? ChildProcess.capture(
            "/bin/mount", ["-t", "tmpfs", "-o", "size=4m,mode=0700", "tokenbroker-soak", path],
            environment: ["PATH": "/usr/bin:/bin"])
        return mounted?.status == 0
    }

    private static func unmount(_ path: String) {
        _ = try? ChildProcess.capture("/bin/umount", [path], environment: ["PATH": "/usr/bin:/bin"])
    }

    private static func progress(_ text: String) {
        FileHandle.standardError.write(Data(("[soak] " + text + "\n").utf8))
    }
}
