import BrokerIdP
import BrokerModel
import BrokerSecrets
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// The pace of unlock attempts, kept beside the vault (`vault.unlock-pace`) so that a restart of
/// brokerd does not start a wrong passphrase's delay from the beginning
/// (docs/passphrase.md): how many wrong passphrases came in a row, and until when the last one's delay runs.
/// Opened without following a symbolic link, a private file of this uid (as the vault is),
/// bounded and checked when read; replaced whole (a staging file renamed over it).
package struct UnlockPaceFile: Sendable {
    /// What the file holds.
    package struct Pace: Sendable, Equatable {
        /// Wrong passphrases in a row.
        package var failures: Int
        /// When the last one's delay ends: no unlock is tried before.
        package var until: Date

        /// Every stored member, as the synthesized initializer (internal to its module) takes them.
        package init(failures: Int, until: Date) {
            self.failures = failures
            self.until = until
        }
    }

    package let path: String
    /// Most bytes read: the file holds two short lines.
    package static let maximumSize = 64
    /// Most wrong passphrases counted (the delay stops growing long before).
    package static let maximumFailures = 64

    /// The file beside the vault at `vaultPath`.
    package init(vaultPath: String) { path = vaultPath + ".unlock-pace" }

    /// What the file says, cut to bounds: at most `maximumFailures`, and a delay ending at most
    /// `longest` after `now` (a clock set back does not stretch it); `nil` when there is no file.
    /// Throws when the file cannot be trusted or read, or holds anything but its two lines.
    package func read(now: Date, longest: TimeInterval) throws -> Pace? {
        guard let data = try FileSystem.readPrivateFile(path, role: "unlock pace file", limit: Self.maximumSize + 1)
        else { return nil }
        let lines = String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        guard data.count <= Self.maximumSize, lines.count == 3, lines[2].isEmpty,
            let failures = Self.number(lines[0], key: "failures"), let until = Self.number(lines[1], key: "until")
        else {
            throw FileAccessError("refusing the unlock pace file \(path): it is not what brokerd writes there")
        }
        return Pace(
            failures: min(failures, Self.maximumFailures),
            until: min(Date(timeIntervalSince1970: TimeInterval(until)), now.addingTimeInterval(longest)))
    }

    /// Replaces the file with `pace`, or removes it when no wrong passphrase is counted.
    package func save(_ pace: Pace) throws {
        guard pace.failures > 0 else {
            guard unlink(path) == 0 || errno == ENOENT else {
                throw FileAccessError("cannot remove the unlock pace file \(path): \(FileSystem.errnoText())")
            }
            return
        }
        let until = Int64(max(0, pace.until.timeIntervalSince1970.rounded(.up)))
        let staging = path + ".next"
        try FileSystem.writeStagingFile(Data("failures=\(pace.failures)\nuntil=\(until)\n".utf8), at: staging)
        do {
            try FileSystem.replace(path, with: staging)
        } catch {
            unlink(staging)
            throw error
        }
    }

    /// The decimal number of a `key=NUMBER` line (at most 12 digits).
    private static func number(_ line: Substring, key: String) -> Int? {
        guard line.hasPrefix(key + "=") else { return nil }
        let digits = line.dropFirst(key.count + 1)
        guard (1...12).contains(digits.count), digits.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else {
            return nil
        }
        return Int(digits)
    }
}
