import Glibc

/// A fresh private directory under `/tmp` for one fuzz run's files (a vault and its lock).
public func scratchDirectory(_ name: String) -> String {
    var template = Array("/tmp/tokenbroker-fuzz-\(name)-XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { fatalError("cannot create a scratch directory under /tmp") }
    return String(cString: made)
}
