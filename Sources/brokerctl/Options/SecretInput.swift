import ArgumentParser
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// Reads a JSON document from a file, or from stdin for "-", so secrets never appear in argv.
/// Input that is missing or malformed is a data error, not a usage error: one line on stderr
/// and sysexits' code (66, 65), no usage text.
enum SecretInput {
    /// The largest document read (a tokens object is a few KiB).
    static let maximumSize = 1 << 20

    /// The document `option` names (`--secrets`, `--from`) in `source`, decoded as `type`.
    static func read<T: Decodable>(_ source: String, option: String, as type: T.Type) throws -> T {
        let name = source == "-" ? "stdin" : source
        let fd = source == "-" ? STDIN_FILENO : open(source, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw fail(.noInput, "cannot read \(option) \(source): \(String(cString: strerror(errno)))")
        }
        defer { if fd != STDIN_FILENO { close(fd) } }
        let data: Data
        do {
            data = Data(try BoundedInput.read(fd, limit: maximumSize))
        } catch .tooLarge {
            throw fail(.dataError, "\(option): \(name) is larger than 1 MiB")
        } catch {
            throw fail(.noInput, "cannot read \(option) \(name)")
        }
        do {
            return try Wire.makeDecoder().decode(T.self, from: data)
        } catch {
            throw fail(.dataError, "\(option): \(name) is not a JSON tokens object")
        }
    }

    /// Writes `message` on stderr; the exit with `status`.
    private static func fail(_ status: ExitStatus, _ message: String) -> ExitCode {
        StandardStream.error.write("brokerctl: \(message)\n")
        return ExitCode(status)
    }
}
