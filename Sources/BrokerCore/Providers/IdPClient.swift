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

    func post(_ url: URL, headers: HTTPHeaders, body: String) async -> Result<IdPReply, RefreshFailure> {
        guard EndpointPolicy.isAllowed(url) else {
            return .failure(.denial("the IdP URL must use https (plain http is allowed for loopback only)"))
        }
        var request = HTTPClientRequest(url: url.absoluteString)
        request.method = .POST
        request.headers = headers
        request.body = .bytes(ByteBuffer(string: body))
        do {
            let response = try await client.execute(
                request, deadline: .now() + .milliseconds(Int64(requestTimeout * 1000)))
            let bytes = try await response.body.collect(upTo: 1 << 20)
            return .success(
                IdPReply(
                    status: Int(response.status.code), body: Data(bytes.readableBytesView),
                    retryAfter: response.headers.first(name: "Retry-After").flatMap(Self.retryAfter)))
        } catch {
            return .failure(.transient("cannot reach the IdP at \(url.host ?? "?"): \(Self.describe(error))"))
        }
    }

    private static func describe(_ error: any Error) -> String {
        if let error = error as? HTTPClientError {
            switch error {
            case .deadlineExceeded: return "timed out"
            case .connectTimeout: return "connect timed out"
            default: return String(describing: error)
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
