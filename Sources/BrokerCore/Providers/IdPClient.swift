import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

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
                connect: .milliseconds(Int64(settings.connectTimeout * 1000)),
                read: .milliseconds(Int64(settings.requestTimeout * 1000))))
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
    func send(
        method: HTTPMethod, url: URL, headers: HTTPHeaders, body: String? = nil, target: String? = nil
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
                request, deadline: .now() + .milliseconds(Int64(requestTimeout * 1000)))
            let bytes = try await response.body.collect(upTo: 1 << 20)
            return .success(
                IdPReply(
                    status: Int(response.status.code), body: Data(bytes.readableBytesView),
                    retryAfter: response.headers.first(name: "Retry-After").flatMap(Self.retryAfter)))
        } catch {
            let name = target ?? "the IdP at \(url.host ?? "?")"
            return .failure(.transient("cannot reach \(name): \(Self.describe(error))"))
        }
    }

    /// A form POST to a token endpoint.
    func post(_ url: URL, headers: HTTPHeaders, body: String) async -> Result<IdPReply, RefreshFailure> {
        await send(method: .POST, url: url, headers: headers, body: body)
    }

    private static func describe(_ error: any Error) -> String {
        if let error = error as? HTTPClientError {
            switch error {
            // The read timeout and the deadline are both the total timeout; which fires first is chance.
            case .deadlineExceeded, .readTimeout, .writeTimeout: return "timed out"
            case .connectTimeout: return "connect timed out"
            default:
                let text = String(describing: error)
                // invalidHeaderFieldNames/Values carry the offending header, which may hold a secret.
                return text.contains("invalidHeaderField") ? "a request header is not valid HTTP" : text
            }
        }
        return String(describing: type(of: error))
    }

    static func retryAfter(_ value: String) -> TimeInterval? {
        if let seconds = TimeInterval(value.trimmingCharacters(in: .whitespaces)) { return max(0, seconds) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return formatter.date(from: value).map { max(0, $0.timeIntervalSinceNow) }
    }
}

/// HTTPS everywhere, except IdPs on the loopback interface (tests, local helpers).
public enum EndpointPolicy {
    public static func isAllowed(_ url: URL) -> Bool {
        switch url.scheme?.lowercased() {
        case "https": return url.host != nil
        case "http": return isLoopback(url.host ?? "")
        default: return false
        }
    }

    /// `localhost`, `::1`, or an IPv4 literal in 127.0.0.0/8 (not a DNS name that merely starts with 127.).
    static func isLoopback(_ host: String) -> Bool {
        if host == "localhost" || host == "::1" || host == "[::1]" { return true }
        let octets = host.split(separator: ".", omittingEmptySubsequences: false)
        return octets.count == 4 && octets.first == "127"
            && octets.allSatisfy { $0.count <= 3 && UInt8($0) != nil }
    }
}
