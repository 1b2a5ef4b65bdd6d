/// Host names that reach this machine only, whatever the resolver says: plain http is allowed
/// to them (IdP URLs, docs/security.md, "What brokerd does not trust"; the git and docker
/// bridges, docs/bridges.md).
public enum LoopbackHost {
    /// `localhost`, `::1` (bracketed or not), or a dotted-quad IPv4 literal in 127.0.0.0/8
    /// written the canonical way (no leading zeros, each part 0-255), which no resolver reads
    /// differently.
    public static func contains(_ host: String) -> Bool {
        if host == "localhost" || host == "::1" || host == "[::1]" { return true }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts.first == "127"
            && parts.allSatisfy { part in
                part.count <= 3 && part.utf8.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }
                    && !(part.count > 1 && part.first == "0") && (Int(part) ?? 256) <= 255
            }
    }

    /// Whether `host`, as git names it (`host` or `host:port`, `[::1]:port`), is one of these.
    public static func contains(hostAndPort host: String) -> Bool {
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return false }
            let rest = host[host.index(after: close)...]
            return (rest.isEmpty || rest.hasPrefix(":")) && contains(String(host[...close]))
        }
        return contains(String(host.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)[0]))
    }
}
