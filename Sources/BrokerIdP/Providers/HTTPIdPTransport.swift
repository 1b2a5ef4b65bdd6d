import AsyncHTTPClient
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// The broker's IdP transport: HTTP/1.1 over AsyncHTTPClient, with bounded connect and total
/// timeouts, no redirects, and token answers wiped from the connection's buffers once read.
public final class HTTPIdPTransport: IdPTransport {
    private let client: HTTPClient

    public init(settings: BrokerSettings) {
        var configuration = HTTPClient.Configuration(
            redirectConfiguration: .disallow,
            timeout: .init(
                connect: .milliseconds(Int64(Bounds.milliseconds(settings.connectTimeout))),
                read: .milliseconds(Int64(Bounds.milliseconds(settings.requestTimeout)))))
        configuration.httpVersion = .http1Only
        client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    public func shutdown() async {
        try? await client.shutdown()
    }

    public func exchange(_ request: IdPRequest) async -> Result<IdPAnswer, IdPTransportFailure> {
        var outgoing = HTTPClientRequest(url: request.url.absoluteString)
        outgoing.method = request.method
        outgoing.headers = request.headers
        if let body = request.body { outgoing.body = .bytes(ByteBuffer(string: body)) }
        do {
            let response = try await client.execute(
                outgoing, deadline: .now() + .milliseconds(Int64(Bounds.milliseconds(request.timeout))))
            let bytes =
                try await request.isPublic
                ? response.body.collect(upTo: request.bodyLimit)
                : Self.collectWiping(response.body, upTo: request.bodyLimit)
            return .success(
                IdPAnswer(
                    status: Int(response.status.code), headers: response.headers,
                    body: Data(bytes.readableBytesView)))
        } catch {
            return .failure(IdPTransportFailure(reason: Self.describe(error)))
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

    /// Why a request failed, for people: "connection refused", "timed out", "TLS handshake
    /// failed"; never a Swift type's name or value.
    package static func describe(_ error: any Error) -> String {
        switch error {
        case let error as HTTPClientError:
            switch error {
            // The read timeout and the deadline are both the total timeout; which fires first is chance.
            case .deadlineExceeded, .readTimeout, .writeTimeout: return IdPTransportFailure.timedOut.reason
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
            return IdPTransportFailure.tooLarge.reason
        default:
            // NIOSSLError, BoringSSLError: the certificate or the handshake was refused.
            return String(reflecting: type(of: error)).contains("SSL")
                ? "TLS handshake failed" : "the connection failed"
        }
    }
}
