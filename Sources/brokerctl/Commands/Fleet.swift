import ArgumentParser
import BrokerClient
import BrokerProtocol

#if canImport(Glibc)
import Glibc
#endif

struct Fleet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fleet",
        abstract: "Set up a fleet: brokers on many hosts sharing accounts through one PostgreSQL database.",
        discussion: "See docs/fleet.md.",
        subcommands: [FleetInit.self, FleetStatus.self])
}

struct FleetInit: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Write a new fleet key (32 random bytes, mode 0600) and say how to install it on each host.",
        discussion: """
            Needs no broker and no database. The key seals every shared account's row: install the same
            file on every host of the fleet. An existing file is never overwritten.
            """)

    @Option(help: "Where to write the key (a new file; its directory must exist and be yours).")
    var keyFile: String

    func run() throws {
        guard !keyFile.isEmpty else { throw ValidationError("--key-file must be a path") }
        // glibc's arc4random_buf reads the kernel's CSPRNG (getrandom).
        var bytes = [UInt8](repeating: 0, count: 32)
        bytes.withUnsafeMutableBytes { arc4random_buf($0.baseAddress!, 32) }
        defer { bytes.withUnsafeMutableBytes { _ = memset($0.baseAddress!, 0, 32) } }
        let fd = open(keyFile, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let reason =
                errno == EEXIST
                ? "a file is there already; a fleet key is never overwritten" : String(cString: strerror(errno))
            throw BridgeFailure("cannot create \(keyFile): \(reason)")
        }
        defer { close(fd) }
        guard fchmod(fd, 0o600) == 0, write(fd, bytes, bytes.count) == bytes.count, fsync(fd) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(keyFile)
            throw BridgeFailure("cannot write \(keyFile): \(reason)")
        }
        print(
            """
            wrote a new fleet key to \(keyFile) (mode 0600)
            Install this same file on every host of the fleet, then on each one either:
              - encrypt it as a systemd credential and give it to the unit:
                  systemd-creds encrypt --name=fleet-key \(keyFile) /etc/credstore.encrypted/fleet-key
                  LoadCredentialEncrypted=fleet-key      (in the unit's [Service])
              - or keep it as a file of the broker's user (mode 0600 or 0400) and set in broker.toml:
                  [fleet]
                  key_file = "/path/to/fleet.key"
            The first broker to reach the database seals its canary with this key; a broker holding
            another key refuses to start.
            """)
    }
}

struct FleetStatus: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show the fleet's database as the broker sees it: reachable or why not, its hosts, the leases held.")

    @OptionGroup var options: GlobalOptions

    func run() throws {
        try options.run(.fleetStatus) { Self.render($0) }
    }

    static func render(_ status: FleetStatusResult) -> String {
        var lines = [
            "this host: \(status.host) (\(status.sharedAccounts) shared account\(status.sharedAccounts == 1 ? "" : "s"))",
            status.reachable
                ? "database: reachable, schema version \(status.schema ?? 0)"
                : "database: unreachable: \(status.reason ?? "no reason given")",
        ]
        if !status.hosts.isEmpty {
            lines.append("hosts:")
            let width = status.hosts.map(\.host.count).max() ?? 0
            lines += status.hosts.map {
                "  \(padded($0.host, to: width))  seen \(StatusTable.duration(max(1, $0.seenSecondsAgo))) ago"
            }
        }
        if !status.leases.isEmpty {
            lines.append("leases:")
            let width = status.leases.map(\.account.count).max() ?? 0
            lines += status.leases.map {
                "  \(padded($0.account, to: width))  held by \($0.holder), \(StatusTable.duration(max(1, $0.secondsLeft))) left"
            }
        }
        return lines.joined(separator: "\n")
    }
}

struct Share: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "share",
        abstract: "Move a local account into the fleet's shared store, served by every broker of the fleet.",
        discussion: """
            The row is written to the database before the local copy is removed: a crash at any step
            leaves the account in exactly one place. See docs/fleet.md.
            """)

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func run() throws {
        try options.run(.share(account: account)) { "shared \($0.account) with the fleet (\($0.state))" }
    }
}

struct Unshare: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unshare",
        abstract: "Move a shared account out of the fleet's store into this broker's vault.",
        discussion: """
            The other brokers of the fleet stop serving it at their next read of the database (within
            a lease period). See docs/fleet.md.
            """)

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func run() throws {
        try options.run(.unshare(account: account)) { "moved \($0.account) out of the fleet (\($0.state))" }
    }
}
