import Glibc

/// A fresh private directory for one fuzz process's files (a vault and its lock), under
/// `$TMPDIR` (`fuzz/run` points it at a directory it removes afterwards), else `/tmp`.
public func scratchDirectory(_ name: String) -> String {
    let base = getenv("TMPDIR").map { String(cString: $0) } ?? "/tmp"
    var template = Array("\(base)/tokenbroker-fuzz-\(name)-XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { fatalError("cannot create a scratch directory under \(base)") }
    return String(cString: made)
}
