import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// brokerd under a locked-memory limit it soon reaches (`RLIMIT_MEMLOCK`, and, as root, without
/// `CAP_IPC_LOCK`, which would ignore the limit): secrets it cannot lock stay usable, every
/// token is served, the failure is logged once and `status` shows it.
@Suite struct LockedMemoryLimitTests {
    @Test func everyTokenIsServedAndTheUnlockedMemoryIsLoggedOnceAndShown() async throws {
        let broker = try BrokerProcess()
        broker.launcher = Self.launcher(lockingAtMost: 65536)
        try await broker.start()
        defer { broker.stop() }
        let pid = try #require(broker.process?.pid)
        let limits = try String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8)
        #expect(Self.lockedLimit(limits) == "65536", "the limit is in force")
        #expect(!Self.mayLockBeyondTheLimit(pid: pid), "brokerd holds no CAP_IPC_LOCK")

        // 100 accounts with 9 KB tokens: with their prepared answers, about 3 MiB of secrets.
        let tokens = (0..<100).map { "at-\($0)-" + String(repeating: longRandomHex(), count: 225) }
        let socketPath = broker.socketPath
        let (served, status) = try await onOwnThread {
            let connection = try RawConnection(path: socketPath)
            for (index, token) in tokens.enumerated() {
                _ = connection.request(
                    #"{"id":1,"op":"add","account":"a\#(index)","provider":{"kind":"static"},"#
                        + #""tokens":{"access_token":"\#(token)","expires_in":3600}}"#)
            }
            let served = tokens.indices.filter { index in
                let answer = connection.request(#"{"id":2,"op":"token","account":"a\#(index)"}"#) ?? ""
                return answer.contains(#""access_token":"\#(tokens[index])""#)
            }.count
            return (served, connection.request(#"{"id":3,"op":"status"}"#) ?? "")
        }
        #expect(served == 100, "every token is served")
        #expect(status.contains(#""memory_locked":false"#), "status shows the unlocked memory")
        let shown = try await broker.brokerctl(["status"])
        #expect(shown.status == 0 && shown.stdout.contains("not all locked in memory"), "\(shown.stdout)")
        let lines = broker.log.split(separator: "\n").filter { $0.contains("mlock") }
        #expect(lines.count == 1, "logged once: \(lines)")
        #expect(lines.first?.contains("RLIMIT_MEMLOCK") == true)
        #expect(broker.process?.hasExited() == false, "brokerd is still running")
    }

    /// A DPoP key under a limit that the broker's own guarded pages fit in but OpenSSL's secure
    /// heap (1 MiB, docs/dpop.md, "Signing") does not: proofs are still signed, the failure
    /// is logged once and `status` shows it, from the first key on.
    @Test func aDPoPKeyWhoseHeapCannotBeLockedStillSignsAndStatusShowsIt() async throws {
        let broker = try BrokerProcess()
        broker.launcher = Self.launcher(lockingAtMost: 256 << 10)
        try await broker.start()
        defer { broker.stop() }
        let socketPath = broker.socketPath
        let answers = try await onOwnThread {
            let connection = try RawConnection(path: socketPath)
            return [
                #"{"id":1,"op":"status"}"#,
                #"{"id":2,"op":"add","account":"api","provider":{"kind":"oauth2","token_endpoint":"https://idp.example/token","client_id":"cli","dpop":"ES256"},"#
                    + #""tokens":{"access_token":"at-dpop","token_type":"DPoP","expires_in":3600}}"#,
                #"{"id":3,"op":"token","account":"api","dpop":{"htm":"GET","htu":"https://api.example/v1/items"}}"#,
                #"{"id":4,"op":"status"}"#,
            ].map { connection.request($0) ?? "" }
        }
        #expect(answers[0].contains(#""ok":true"#) && !answers[0].contains("memory_locked"), "\(answers[0])")
        #expect(answers[2].contains(#""dpop_proof":""#), "the proof is signed: \(answers[2])")
        #expect(answers[3].contains(#""memory_locked":false"#), "status shows the unlocked memory")
        let lines = broker.log.split(separator: "\n").filter { $0.contains("mlock") }
        #expect(lines.count == 1 && lines.first?.contains("DPoP keys") == true, "logged once: \(lines)")
        #expect(broker.process?.hasExited() == false, "brokerd is still running")
    }

    /// Runs brokerd under a locked-memory limit of `bytes` and, as root, without `CAP_IPC_LOCK`.
    static func launcher(lockingAtMost bytes: Int) -> [String] {
        ["/usr/bin/prlimit", "--memlock=\(bytes):\(bytes)", "--"]
            + (getuid() == 0 ? ["/usr/bin/setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--"] : [])
    }

    /// The soft limit of `Max locked memory` in a /proc/PID/limits text.
    static func lockedLimit(_ limits: String) -> String? {
        let line = limits.split(separator: "\n").first { $0.hasPrefix("Max locked memory") }
        return line?.split(separator: " ", omittingEmptySubsequences: true).dropFirst(3).first.map(String.init)
    }

    /// Whether `pid` holds `CAP_IPC_LOCK` (bit 14 of `CapEff`), which lets it lock past any limit.
    static func mayLockBeyondTheLimit(pid: pid_t) -> Bool {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("CapEff:") }
        let mask = line.flatMap {
            UInt64($0.dropFirst("CapEff:".count).trimmingCharacters(in: .whitespaces), radix: 16)
        }
        return (mask ?? 0) & (1 << 14) != 0
    }
}
