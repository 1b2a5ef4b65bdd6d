import AsyncHTTPClient
import BrokerProtocol
import FoundationEssentials
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// An identity provider's answer, read whole (bounded).
struct IdPReply: Sendable {
    var status: Int
    var body: Data
    /// `Retry-After`, in seconds, from either of its two forms.
    var retryAfter: TimeInterval?
}

/// The HTTP client every provider shares: bounded connect and total timeouts,
/// no redirects, bodies capped at 1 MiB.
public final class IdPClient: Sendable {
    private let client: HTTPClient
    private let requestTimeout: TimeInterval
    /// Discovered OIDC token endpoints, shared by every account that names an issuer.
    let discovery = DiscoveryCache()

    public init(settings: BrokerSettings) {
        var configuration = HTTPClient.Configuration(
            redirectConfiguration: .disallow,
            timeout: .init(
                connect: .milliseconds(Int64(Bounds.milliseconds(settings.connectTimeout))),
                read: .milliseconds(Int64(Bounds.milliseconds(settings.requestTimeout)))))
        configuration.httpVersion = .http1Only
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        requestTimeout = settings.requestTimeout
    }

    /// Closes idle connections; call once before exit.
    public func shutdown() async {
        try? await client.shutdown()
    }

    /// Sends one request and reads the whole answer (bounded). `target` names the endpoint in
    /// failure messages; pass it for secret URLs (e.g. "the refresh URL"), whose host and path
    /// must never appear in a message. Without it, messages name the IdP's host.
    /// `public`: the answer carries no secret (a discovery document), so its buffer is left as is.
    func send(
        method: HTTPMethod, url: URL, headers: HTTPHeaders, body: String? = nil, target: String? = nil,
        public: Bool = false
    ) async -> Result<IdPReply, RefreshFailure> {
        guard EndpointPolicy.isAllowed(url) else {
            return .failure(
                .denial("\(target ?? "the IdP URL") must use https (plain http is allowed for loopback only)"))
        }
        var request = HTTPClientRequest(url: url.absoluteString)
        request.method = method
        request.headers = headers
        if let body { request.body = .bytes(ByteBuffer(string: body)) }
        do {
            let response = try await client.execute(
                request, deadline: .now() + .milliseconds(Int64(Bounds.milliseconds(requestTimeout))))
            let bytes =
                try await `public`
                ? response.body.collect(upTo: 1 << 20) : Self.collectWiping(response.body, upTo: 1 << 20)
            return .success(
                IdPReply(
                    status: Int(response.status.code), body: Data(bytes.readableBytesView),
                    retryAfter: response.headers.first(name: "Retry-After").flatMap(Self.retryAfter)))
        } catch {
            let name = target ?? "the IdP at \(Self.hostAndPort(url))"
            return .failure(.transient("cannot reach \(name): \(Self.describe(error))"))
        }
    }

    /// The whole body, at most `limit` bytes. Each chunk is a slice of the connection's receive
    /// buffer, which a kept-alive connection reuses and the allocator never sees freed: it is
    /// wiped in place once copied, so no token answer stays behind in it.
    private static func collectWiping(_ body: HTTPClientResponse.Body, upTo limit: Int) async throws -> ByteBuffer {
        var chunks: [ByteBuffer] = []
        // Wiped once the whole answer has been read, so no wipe races the connection's parsing.
        defer {
            for chunk in chunks {
                chunk.withUnsafeReadableBytes { Sodium.wipe(UnsafeMutableRawBufferPointer(mutating: $0)) }
            }
        }
        var collected = ByteBuffer()
        for try await chunk in body {
            chunks.append(chunk)
            guard chunk.readableBytes <= limit - collected.readableBytes else { throw BodyTooLarge() }
            collected.writeImmutableBuffer(chunk)
        }
        return collected
    }

    /// An answer longer than the limit.
    private struct BodyTooLarge: Error {}

    /// A form POST to a token endpoint.
    func post(_ url: URL, headers: HTTPHeaders, body: String) async -> Result<IdPReply, RefreshFailure> {
        await send(method: .POST, url: url, headers: headers, body: body)
    }

    /// `host:port` of `url`, the port given or the scheme's, for messages about reaching it.
    static func hostAndPort(_ url: URL) -> String {
        "\(url.host ?? "?"):\(url.port ?? (url.scheme == "http" ? 80 : 443))"
    }

    /// Why a request failed, for people: "connection refused", "timed out", "TLS handshake
    /// failed"; never a Swift type's name or value.
    static func describe(_ error: any Error) -> String {
        switch error {
        case let error as HTTPClientError:
            switch error {
            // The read timeout and the deadline are both the total timeout; which fires first is chance.
            case .deadlineExceeded, .readTimeout, .writeTimeout: return "timed out"
            case .connectTimeout: return "connect timed out"
            case .tlsHandshakeTimeout: return "TLS handshake timed out"
            case .remoteConnectionClosed: return "the connection was closed before the answer"
            // invalidHeaderFieldNames/Values carry the offending header, which may hold a secret.
            default:
                return String(describing: error).contains("invalidHeaderField")
                    ? "a request header is not valid HTTP" : "the HTTP exchange failed"
            }
        case let error as IOError:
            let reason = String(cString: strerror(error.errnoCode))
            return reason.prefix(1).lowercased() + reason.dropFirst()
        case let error as NIOConnectionError:
            if error.dnsAError != nil || error.dnsAAAAError != nil { return "its host name does not resolve" }
            return error.connectionErrors.first.map { describe($0.error) } ?? "no address to connect to"
        case ChannelError.connectTimeout:
            return "connect timed out"
        case is BodyTooLarge:
            return "the answer is longer than 1 MiB"
        default:
            // NIOSSLError, BoringSSLError: the certificate or the handshake was refused.
            return String(reflecting: type(of: error)).contains("SSL")
                ? "TLS handshake failed" : "the connection failed"
        }
    }

    /// `Retry-After` in seconds (RFC 9110 section 10.2.3: delay-seconds, or an HTTP-date), at
    /// most `Bounds.maximumLifetime`; callers cut it further to `backoff_cap`. `nil` when unreadable.
    static func retryAfter(_ value: String) -> TimeInterval? {
        let text = value.trimmingSpaces()
        if !text.isEmpty, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            return Bounds.lifetime(Double(text) ?? .infinity) ?? Bounds.maximumLifetime
        }
        return httpDate(text).flatMap { Bounds.lifetime(max(0, $0.timeIntervalSinceNow)) }
    }

    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110 section 5.6.7), read by hand:
    /// Foundation's `DateFormatter` traps on some non-ASCII input (found by fuzzing).
    static func httpDate(_ text: String) -> Date? {
        guard text.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) else { return nil }
        let parts = text.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 6, parts[0].count == 4, parts[0].hasSuffix(","), parts[5] == "GMT",
            let month = months.firstIndex(of: String(parts[2]))
        else { return nil }
        let iso = "\(parts[3])-\(month < 9 ? "0" : "")\(month + 1)-\(parts[1])T\(parts[4])Z"
        return Timestamp.parse(iso, defaultZone: .utc)
    }
}
