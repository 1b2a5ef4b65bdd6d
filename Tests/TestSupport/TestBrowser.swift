import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// The test playing the user's browser: one request, redirects not followed, so the test sees
/// where the IdP sends the browser and then goes there itself.
public enum TestBrowser {
    /// What a page answered.
    public struct Page: Sendable {
        public var status: Int
        /// The `Location` header of a redirect.
        public var location: String?
        public var body: String
    }

    /// GETs `url` without following a redirect.
    public static func get(_ url: String) async throws -> Page {
        try await send(HTTPClientRequest(url: url))
    }

    /// POSTs an `application/x-www-form-urlencoded` body to `url`.
    public static func post(_ url: String, form: String) async throws -> Page {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        request.body = .bytes(ByteBuffer(string: form))
        return try await send(request)
    }

    private static func send(_ request: HTTPClientRequest) async throws -> Page {
        let client = HTTPClient(
            eventLoopGroupProvider: .singleton,
            configuration: HTTPClient.Configuration(
                redirectConfiguration: .disallow, timeout: .init(connect: .seconds(5))))
        do {
            let response = try await client.execute(request, deadline: .now() + .seconds(10))
            let body = try await response.body.collect(upTo: 1 << 20)
            try await client.shutdown()
            return Page(
                status: Int(response.status.code), location: response.headers.first(name: "Location"),
                body: String(buffer: body))
        } catch {
            try? await client.shutdown()
            throw error
        }
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

    /// GETs the authorization URL, expects the IdP's redirect, and returns where it points.
    public static func authorize(_ url: String) async throws -> String {
        let page = try await get(url)
        guard page.status == 302, let location = page.location else {
            throw HarnessError("the authorization endpoint answered \(page.status) without a redirect: \(page.body)")
        }
        return location
    }
}
