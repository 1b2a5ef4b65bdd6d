import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// Standard output and error (or another descriptor), written to directly: a line appears at
/// once, even in a pipe.
struct StandardStream {
    static let output = StandardStream(descriptor: STDOUT_FILENO)
    static let error = StandardStream(descriptor: STDERR_FILENO)

    let descriptor: Int32

    /// Writes all of `text`, retrying after a signal or a short write; `false` when it could not.
    @discardableResult
    func write(_ text: String) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = Glibc.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0, errno == EINTR { continue }
                guard written > 0 else { return false }
                offset += written
            }
            return true
        }
    }
}
