import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// The `secrets_file` of `login`: a JSON object `{"client_secret": "..."}` the broker reads
/// itself, so the secret never passes through brokerctl. Two forms only: a regular file of the
/// broker's uid (not a symbolic link), or `/proc/<pid>/fd/<n>` of the connecting process
/// (brokerctl's standard input for `--secrets -`), read without blocking, for at most 10 s.
public enum SecretsFile {
    /// Largest secrets file read, in bytes.
    package static let limit = 64 * 1024
    /// How long a descriptor of the peer may take to reach its end.
    package static let descriptorDeadline: Duration = .seconds(10)

    /// The client secret the file at `path` holds; `peerPID` is the connecting process
    /// (`SO_PEERCRED`). Every refusal names the rule, never the content.
    public static func clientSecret(at path: String, peerPID: Int32) async throws(BrokerFailure) -> String {
        guard path.hasPrefix("/"), path.utf8.count <= 4096, !path.utf8.contains(0) else {
            throw .invalid("\"secrets_file\" must be an absolute path")
        }
        var content: Data
        if path.hasPrefix("/proc/") {
            guard let descriptor = peerDescriptor(path), peerPID > 0, descriptor.pid == peerPID else {
                throw .invalid(
                    "\"secrets_file\" under /proc must be /proc/<pid>/fd/<n> of the connecting process itself")
            }
            content = try await readDescriptor(path)
        } else {
            let data: Data?
            do {
                data = try FileSystem.readOwnedFile(path, role: "secrets file", limit: limit)
            } catch {
                throw .invalid("\(error)")
            }
            guard let data else { throw .invalid("the secrets file \(path) does not exist") }
            content = data
        }
        defer { Sodium.wipe(&content) }
        guard let secret = JSONValue.object(decoding: content)?["client_secret"]?.text, !secret.isEmpty else {
            throw .invalid("the secrets file must hold a JSON object with a non-empty string \"client_secret\"")
        }
        return secret
    }

    /// The pid and descriptor number of `/proc/<pid>/fd/<n>`, or `nil` for any other path.
    package static func peerDescriptor(_ path: String) -> (pid: Int32, fd: Int32)? {
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        let digits = { (part: Substring) in
            !part.isEmpty && part.utf8.count <= 9 && part.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 }
        }
        guard parts.count == 5, parts[0].isEmpty, parts[1] == "proc", parts[3] == "fd", digits(parts[2]),
            digits(parts[4]), let pid = Int32(parts[2]), let fd = Int32(parts[4])
        else { return nil }
        return (pid, fd)
    }

    /// Reads a descriptor of the peer to its end without blocking a thread: non-blocking reads,
    /// a short sleep while nothing is there, `descriptorDeadline` in all, `limit` bytes at most.
    private static func readDescriptor(_ path: String) async throws(BrokerFailure) -> Data {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            throw .invalid("cannot open \"secrets_file\" \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        let deadline = ContinuousClock.now + descriptorDeadline
        var content = Data()
        var buffer = Data(count: 4096)
        defer { Sodium.wipe(&buffer) }
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count > 0 {
                content.append(buffer.prefix(count))
                guard content.count <= limit else {
                    Sodium.wipe(&content)
                    throw .invalid("the secrets file is larger than \(limit / 1024) KiB")
                }
            } else if count == 0 {
                return content
            } else if errno == EINTR {
                continue
            } else if errno == EAGAIN || errno == EWOULDBLOCK {
                guard ContinuousClock.now < deadline, (try? await EventLoopSleep.sleep(for: .milliseconds(10))) != nil
                else {
                    Sodium.wipe(&content)
                    throw .invalid("the secrets file did not reach its end within 10 s")
                }
            } else {
                Sodium.wipe(&content)
                throw .invalid("cannot read \"secrets_file\" \(path): \(String(cString: strerror(errno)))")
            }
        }
    }
}
