import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault

/// systemd unit names, and the unit a process runs in as its cgroup path shows it.
public enum SystemdUnit {
    /// Longest unit name systemd accepts.
    package static let maximumLength = 255

    /// Whether `name` is the name of a unit a process can run in: a service or a scope, in
    /// systemd's characters (`ci-runner.service`, `getty@tty1.service`, `session-2.scope`).
    public static func isUnitName(_ name: some StringProtocol) -> Bool {
        guard name.utf8.count <= maximumLength else { return false }
        let stem: Substring.UTF8View
        if name.hasSuffix(".service") {
            stem = Substring(name).utf8.dropLast(".service".utf8.count)
        } else if name.hasSuffix(".scope") {
            stem = Substring(name).utf8.dropLast(".scope".utf8.count)
        } else {
            return false
        }
        return !stem.isEmpty && stem.allSatisfy(isUnitCharacter)
    }

    private static func isUnitCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: ":"), UInt8(ascii: "-"), UInt8(ascii: "_"),
            UInt8(ascii: "."), UInt8(ascii: "\\"), UInt8(ascii: "@"):
            return true
        default:
            return false
        }
    }

    /// The unit of a process from the text of its `/proc/PID/cgroup`: the unified hierarchy's
    /// line (`0::/path`), or systemd's own on a legacy hierarchy (`N:name=systemd:/path`).
    public static func unit(fromCgroupFile text: some StringProtocol) -> String? {
        var legacy: Substring?
        for line in Substring(text).split(separator: "\n") {
            if line.hasPrefix("0::") { return unit(ofCgroup: line.dropFirst(3)) }
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            if fields.count == 3, fields[1] == "name=systemd" { legacy = fields[2] }
        }
        return legacy.flatMap { unit(ofCgroup: $0) }
    }

    /// The unit a cgroup path names, as systemd reads it: the first component that is not a
    /// slice (`user.slice/user-1000.slice/session-2.scope` is `session-2.scope`); under a user
    /// manager (`user@1000.service`), the first one below it that is not a slice
    /// (`…/user@1000.service/app.slice/ci-runner.service` is `ci-runner.service`). Cgroups a
    /// delegated unit makes below itself do not change its unit. `nil` outside any service or scope.
    public static func unit(ofCgroup path: some StringProtocol) -> String? {
        var units = Substring(path).split(separator: "/").lazy.filter { !$0.hasSuffix(".slice") }.makeIterator()
        guard var unit = units.next() else { return nil }
        if isUserManager(unit), let userUnit = units.next() { unit = userUnit }
        return isUnitName(unit) ? String(unit) : nil
    }

    /// Whether `unit` is a user's service manager, `user@UID.service`.
    private static func isUserManager(_ unit: Substring) -> Bool {
        guard unit.hasPrefix("user@"), unit.hasSuffix(".service") else { return false }
        let uid = unit.dropFirst("user@".count).dropLast(".service".count)
        return !uid.isEmpty && uid.allSatisfy(\.isASCII) && uid.allSatisfy(\.isNumber)
    }
}
