import Foundation
import NIOCore
import NIOHTTP1
import Synchronization

/// The test playing the user's browser: one request at a time, redirects not followed, so the
/// test sees where each page sends the browser and then goes there itself. An instance keeps the
/// cookies its pages set for 127.0.0.1 and sends them to every port there, as browsers do; the
/// static methods are a client without cookies (another process on the machine). Pages of the
/// in-process test IdPs are fetched in process (`InProcessIdPNetwork`), the others over HTTP.
public final class TestBrowser: Sendable {
    /// What a page answered.
    public struct Page: Sendable {
        public var status: Int
        /// The `Location` header of a redirect.
        public var location: String?
        public var body: String
        /// The `Set-Cookie` headers, as sent.
        public var setCookies: [String] = []
    }

    /// The cookies set for 127.0.0.1, by name.
    private let cookies = Mutex<[String: String]>([:])

    public init() {}

    /// GETs `url` without following a redirect, sending this browser's cookies when `url` is on
    /// 127.0.0.1, and keeping the cookies the answer sets.
    public func visit(_ url: String) async throws -> Page {
        var headers = HTTPHeaders()
        let local = URLComponents(string: url)?.host == "127.0.0.1"
        let jar = cookies.withLock { $0 }
        if local, !jar.isEmpty {
            headers.add(name: "Cookie", value: jar.map { "\($0.key)=\($0.value)" }.joined(separator: "; "))
        }
        let page = try await Self.send(.GET, url, headers: headers)
        if local {
            for line in page.setCookies {
                let pair = line.split(separator: ";")[0].split(separator: "=", maxSplits: 1)
                if pair.count == 2 { cookies.withLock { $0[String(pair[0])] = String(pair[1]) } }
            }
        }
        return page
    }

    /// Opens the page file at `fileURL` (`file://...`) as a browser would: it must lead to one
    /// URL by a meta refresh and by a link (no script); returns that URL.
    public func follow(pageAt fileURL: String) throws -> String {
        guard let url = URL(string: fileURL), url.isFileURL else { throw HarnessError("not a file URL: \(fileURL)") }
        let html = try String(contentsOf: url, encoding: .utf8)
        let refresh = Self.capture(#"http-equiv="refresh" content="0; url=([^"]*)""#, in: html)
        let link = Self.capture(#"<a href="([^"]*)""#, in: html)
        guard let refresh, refresh == link, !html.contains("<script") else {
            throw HarnessError("the page does not lead to one URL by a meta refresh and a link: \(html)")
        }
        return refresh.replacingOccurrences(of: "&amp;", with: "&")
    }

    /// Opens the broker's start link: expects its redirect (with a cookie) and returns where it
    /// points, the IdP's authorization URL.
    public func start(_ startURL: String) async throws -> String {
        let page = try await visit(startURL)
        guard page.status == 302, let location = page.location else {
            throw HarnessError("the start link answered \(page.status) without a redirect: \(page.body)")
        }
        return location
    }

    /// Opens the start link and the IdP's authorization URL it leads to; returns where the IdP
    /// sends the browser back (the callback, not yet visited).
    public func authorize(_ startURL: String) async throws -> String {
        try await Self.authorize(try await start(startURL))
    }

    /// Goes the whole way: the start link, the IdP, and the callback; returns the callback's page.
    public func signIn(_ startURL: String) async throws -> Page {
        try await visit(try await authorize(startURL))
    }

    /// GETs `url` without following a redirect, with no cookies but `cookie` (`name=value`).
    public static func get(_ url: String, cookie: String? = nil) async throws -> Page {
        var headers = HTTPHeaders()
        if let cookie { headers.add(name: "Cookie", value: cookie) }
        return try await send(.GET, url, headers: headers)
    }

    /// POSTs an `application/x-www-form-urlencoded` body to `url`.
    public static func post(_ url: String, form: String) async throws -> Page {
        try await send(
            .POST, url, headers: ["Content-Type": "application/x-www-form-urlencoded"], body: form)
    }

    private static func send(_ method: HTTPMethod, _ url: String, headers: HTTPHeaders, body: String? = nil)
        async throws -> Page
    {
        let reply = try await TestHTTPClient.send(
            method.rawValue, url, headers: headers.map { ($0.name, $0.value) }, body: body)
        let answered = HTTPHeaders(reply.headers)
        return Page(
            status: reply.status, location: answered.first(name: "Location"), body: reply.body,
            setCookies: answered["Set-Cookie"])
    }

    /// Whether something accepts TCP connections on 127.0.0.1:`port` (one plain `connect`:
    /// the HTTP client retries a refused connection until its connect timeout).
    public static func isListening(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// Whether process `pid` holds a socket listening on 127.0.0.1:`port`, from `/proc/net/tcp`
    /// and the process's descriptors: unlike a connect, another process that took the port once it
    /// was freed does not count.
    public static func isListening(_ port: Int, in pid: pid_t) -> Bool {
        guard let table = procFile("/proc/\(pid)/net/tcp") else { return false }
        let local = String(format: "0100007F:%04X", port)
        let inodes = Set(
            table.split(separator: "\n").dropFirst().compactMap { line -> String? in
                let fields = line.split(separator: " ")
                guard fields.count > 9, fields[1] == local, fields[3] == "0A" else { return nil }
                return "socket:[\(fields[9])]"
            })
        guard !inodes.isEmpty,
            let descriptors = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")
        else { return false }
        return descriptors.contains {
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)"))
                .map(inodes.contains) ?? false
        }
    }

    /// The whole of a `/proc` file, read until its end: the kernel makes such files a page at a
    /// time, and a read sized by their (zero) length stops after the first page.
    static func procFile(_ path: String) -> String? {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { return count == 0 ? String(decoding: bytes, as: UTF8.self) : nil }
            bytes += chunk[..<count]
        }
    }

    /// GETs the IdP's authorization URL, expects its redirect, and returns where it points.
    public static func authorize(_ url: String) async throws -> String {
        let page = try await get(url)
        guard page.status == 302, let location = page.location else {
            throw HarnessError("the authorization endpoint answered \(page.status) without a redirect: \(page.body)")
        }
        return location
    }

    /// The first group `pattern` captures in `text`.
    private static func capture(_ pattern: String, in text: String) -> String? {
        guard let expression = try? NSRegularExpression(pattern: pattern),
            let match = expression.firstMatch(in: text, range: NSRange(text.startIndex..., in: text)),
            let range = Range(match.range(at: 1), in: text)
        else { return nil }
        return String(text[range])
    }
}
