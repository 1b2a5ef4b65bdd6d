import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// The page brokerctl opens for a browser login: a file that leads to the broker's one-time
/// start link by a meta refresh and a plain link (no script), so the link is never in a
/// process's arguments or environment (docs/login.md, "The browser flow"): xdg-open and the browser are
/// given only the file's name. The file is 0600 in a 0700 directory of its own under
/// `$XDG_RUNTIME_DIR` (else `$TMPDIR` or `/tmp`); both are removed when the login ends.
struct LoginPage {
    /// The page's directory, made for it alone.
    let directory: String
    /// The page's absolute path.
    let path: String

    /// The page as a `file://` URL (RFC 8089), for xdg-open.
    var url: String {
        let plain = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/".utf8)
        let escaped = path.utf8.map { byte in
            plain.contains(byte)
                ? String(UnicodeScalar(byte)) : "%" + (byte < 16 ? "0" : "") + String(byte, radix: 16, uppercase: true)
        }
        return "file://" + escaped.joined()
    }

    /// Writes the page leading to `link` (the broker's start link, `http` or `https` only); the
    /// failure is the reason, for the user.
    static func write(leadingTo link: String) -> Result<LoginPage, BrowserFailure> {
        guard link.hasPrefix("http://") || link.hasPrefix("https://") else {
            return .failure(BrowserFailure(reason: "the broker's link is not http"))
        }
        var template = Array((baseDirectory() + "/tokenbroker-login-XXXXXX").utf8CString)
        let made = template.withUnsafeMutableBufferPointer { buffer in
            buffer.baseAddress.flatMap(mkdtemp).map { String(cString: $0) }
        }
        guard let made else {
            let reason = String(cString: strerror(errno))
            return .failure(BrowserFailure(reason: "cannot make a directory for the page: \(reason)"))
        }
        let page = LoginPage(directory: made, path: made + "/login.html")
        // mkdtemp's 0700 is cut by the umask (one of 0177 would leave no way in); set it whole.
        guard chmod(made, 0o700) == 0 else {
            let reason = String(cString: strerror(errno))
            page.remove()
            return .failure(BrowserFailure(reason: "cannot make a directory for the page: \(reason)"))
        }
        let fd = open(page.path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let reason = String(cString: strerror(errno))
            page.remove()
            return .failure(BrowserFailure(reason: "cannot write the page: \(reason)"))
        }
        let bytes = Array(html(leadingTo: link).utf8)
        var written = 0
        while written < bytes.count {
            let count = bytes[written...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { break }
            written += count
        }
        close(fd)
        guard written == bytes.count else {
            page.remove()
            return .failure(BrowserFailure(reason: "cannot write the page"))
        }
        return .success(page)
    }

    /// Removes the page and its directory.
    func remove() {
        unlink(path)
        rmdir(directory)
    }

    /// `$XDG_RUNTIME_DIR` (private to the user), else `$TMPDIR`, else `/tmp`: the first that is
    /// an absolute path.
    private static func baseDirectory() -> String {
        for name in ["XDG_RUNTIME_DIR", "TMPDIR"] {
            if let value = getenv(name).map({ String(cString: $0) }), value.hasPrefix("/") { return value }
        }
        return "/tmp"
    }

    /// The page: a meta refresh and a link to `link`, sending no referrer.
    private static func html(leadingTo link: String) -> String {
        let escaped = HTMLText.escaped(link)
        return """
            <!doctype html>
            <html><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
            <meta http-equiv="refresh" content="0; url=\(escaped)">
            <title>tokenbroker sign-in</title></head>
            <body><p><a href="\(escaped)">Continue to sign in</a></p></body></html>

            """
    }
}
