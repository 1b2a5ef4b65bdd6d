import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Hosts of a test fleet on one machine: a network namespace per host, each joined by a veth pair
/// to a Linux bridge in the root namespace, whose address (10.213.X.1/24) serves the hosts what
/// runs in the test's own namespace (PostgreSQL, the IdP). A process runs on a host under
/// `launcher(host:)` (`ip netns exec`, which execs: the PID stays the process's own). Names carry
/// a random suffix after a fixed prefix, so that `removeStale` clears what a test that died
/// halfway left; `remove` is idempotent and every test calls it on every path.
public final class NetworkNamespaces: Sendable {
    public static let ip = "/usr/sbin/ip"
    /// The prefix of every namespace's name (`tbfleet-SUFFIX-hN`).
    public static let namespacePrefix = "tbfleet-"
    /// The prefix of every link's name (`tbfSUFFIXbr`, `tbfSUFFIXvN`): at most 15 characters.
    public static let linkPrefix = "tbf"

    public let namespaces: [String]
    /// Each host's address on the bridge.
    public let hostAddresses: [String]
    /// The bridge's address, where the hosts reach the test's servers.
    public let bridgeAddress: String
    private let bridge: String
    /// The root-namespace end of each host's veth pair.
    private let veths: [String]
    private let removed = Mutex(false)

    /// Whether this machine can make namespaces: root and iproute2.
    public static var isAvailable: Bool { getuid() == 0 && access(ip, X_OK) == 0 }

    /// Makes `hosts` namespaces and the bridge (on a thread of its own), removing stale ones of
    /// earlier runs first.
    public static func make(hosts: Int) async throws -> NetworkNamespaces {
        try await onOwnThread {
            removeStale()
            return try NetworkNamespaces(hosts: hosts)
        }
    }

    private init(hosts: Int) throws {
        let suffix = String(UInt32.random(in: 0...0xFF_FFFF), radix: 16).leftPadded(to: 6)
        let subnet = "10.213.\(Int.random(in: 1...254))"
        bridge = Self.linkPrefix + suffix + "br"
        bridgeAddress = subnet + ".1"
        namespaces = (1...hosts).map { Self.namespacePrefix + suffix + "-h\($0)" }
        hostAddresses = (1...hosts).map { subnet + ".\(10 + $0)" }
        veths = (1...hosts).map { Self.linkPrefix + suffix + "v\($0)" }
        do {
            try Self.run(["link", "add", bridge, "type", "bridge"])
            try Self.run(["addr", "add", bridgeAddress + "/24", "dev", bridge])
            try Self.run(["link", "set", bridge, "up"])
            for index in 0..<hosts {
                let (namespace, veth, peer) = (namespaces[index], veths[index], veths[index] + "p")
                try Self.run(["netns", "add", namespace])
                try Self.run(["link", "add", veth, "type", "veth", "peer", "name", peer])
                try Self.run(["link", "set", peer, "netns", namespace])
                try Self.run(["link", "set", veth, "master", bridge])
                try Self.run(["link", "set", veth, "up"])
                try Self.run(["-n", namespace, "link", "set", "lo", "up"])
                try Self.run(["-n", namespace, "link", "set", peer, "name", "eth0"])
                try Self.run(["-n", namespace, "addr", "add", hostAddresses[index] + "/24", "dev", "eth0"])
                try Self.run(["-n", namespace, "link", "set", "eth0", "up"])
            }
        } catch {
            remove()
            throw error
        }
    }

    /// The command prefix that runs a program on `host` (0-based).
    public func launcher(host: Int) -> [String] { [Self.ip, "netns", "exec", namespaces[host]] }

    /// Cuts `host` off the bridge (its veth down): its open connections stall, its loopback
    /// stays.
    public func cut(host: Int) throws { try Self.run(["link", "set", veths[host], "down"]) }

    /// Joins `host` to the bridge again.
    public func restore(host: Int) throws { try Self.run(["link", "set", veths[host], "up"]) }

    /// A TCP listener on 127.0.0.1:`port` inside `host`'s namespace (made on a thread that enters
    /// it; a socket stays in the namespace it was made in). The caller closes it.
    public func listener(host: Int, port: Int) throws -> Int32 {
        let namespace = namespaces[host]
        let result = Mutex<Result<Int32, HarnessError>?>(nil)
        let thread = Thread {
            result.withLock { $0 = Self.listenerHere(namespace: namespace, port: port) }
        }
        thread.start()
        guard Poll.blocking(timeout: 10, every: .milliseconds(1), { result.withLock { $0 } != nil }),
            let done = result.withLock({ $0 })
        else { throw HarnessError("no listener made in \(namespace) within 10 s") }
        return try done.get()
    }

    /// Removes the namespaces (their veths go with them) and the bridge; again does nothing.
    public func remove() {
        guard
            removed.withLock({ removed in
                defer { removed = true }; return !removed
            })
        else { return }
        for namespace in namespaces { try? Self.run(["netns", "delete", namespace]) }
        try? Self.run(["link", "delete", bridge])
    }

    /// Removes every namespace and link an earlier run left (by their prefixes).
    public static func removeStale() {
        let namespaces = (try? output(["netns", "list"])) ?? ""
        for line in namespaces.split(separator: "\n") {
            let name = String(line.split(separator: " ").first ?? "")
            if name.hasPrefix(namespacePrefix) { try? run(["netns", "delete", name]) }
        }
        let links = (try? output(["-o", "link", "show"])) ?? ""
        for line in links.split(separator: "\n") {
            // "7: tbf1a2b3cbr: <...>" or "8: tbf1a2b3cv1@if9: <...>"
            let fields = line.split(separator: " ")
            guard fields.count > 1 else { continue }
            let name = String(fields[1].prefix { $0 != ":" && $0 != "@" })
            let isOurs =
                name.hasPrefix(linkPrefix) && name.count >= linkPrefix.count + 8
                && (name.hasSuffix("br") || name.dropLast().hasSuffix("v"))
            if isOurs { try? run(["link", "delete", name]) }
        }
    }

    private static func listenerHere(namespace: String, port: Int) -> Result<Int32, HarnessError> {
        let handle = open("/run/netns/" + namespace, O_RDONLY | O_CLOEXEC)
        guard handle >= 0 else { return .failure(HarnessError("cannot open namespace \(namespace)")) }
        defer { close(handle) }
        guard let setns = Self.setns, setns(handle, 0x4000_0000 /* CLONE_NEWNET */) == 0 else {
            return .failure(HarnessError("cannot enter \(namespace): errno \(errno)"))
        }
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return .failure(HarnessError("socket failed: errno \(errno)")) }
        var yes: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = in_addr_t(0x7F00_0001).bigEndian
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(descriptor, 512) == 0 else {
            close(descriptor)
            return .failure(HarnessError("cannot listen on 127.0.0.1:\(port) in \(namespace): errno \(errno)"))
        }
        return .success(descriptor)
    }

    /// glibc's setns(2), which Swift's Glibc module leaves out (it is declared under _GNU_SOURCE).
    private static let setns: (@convention(c) (Int32, Int32) -> Int32)? = {
        // RTLD_DEFAULT (a null handle): the symbol wherever the process has it.
        guard let symbol = dlsym(nil, "setns") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (Int32, Int32) -> Int32).self)
    }()

    private static func run(_ arguments: [String]) throws {
        let result = try ChildProcess.run(ip, arguments, environment: ["PATH": "/usr/sbin:/usr/bin:/bin"], timeout: 30)
        guard result.status == 0 else { throw HarnessError("ip \(arguments.joined(separator: " ")): \(result.output)") }
    }

    private static func output(_ arguments: [String]) throws -> String {
        let result = try ChildProcess.capture(
            ip, arguments, environment: ["PATH": "/usr/sbin:/usr/bin:/bin"], timeout: 30)
        guard result.status == 0 else { throw HarnessError("ip \(arguments.joined(separator: " ")): \(result.stderr)") }
        return result.stdout
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        String(repeating: "0", count: max(0, width - count)) + self
    }
}
