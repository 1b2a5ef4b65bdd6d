import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// One request with the headers a test chooses (a `DPoP` proof, an `Authorization` scheme), to
/// a test server over HTTP or in process (`InProcessIdPNetwork`), redirects not followed: the
/// tests' own client where `TestBrowser`, which sends no such headers, will not do.
public enum TestHTTPClient {
    /// What the server answered.
    public struct Reply: Sendable {
        public var status: Int
        public var headers: [(name: String, value: String)]
        public var body: String

        /// The first value of header `name` (case-insensitive).
        public func header(_ name: String) -> String? {
            headers.first { $0.name.lowercased() == name.lowercased() }?.value
        }

        /// The top-level JSON string member `name` of the body (`nil` when the body is not a
        /// JSON object or the member not a string).
        public func field(_ name: String) -> String? {
            let object = (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any]
            return object?[name] as? String
        }
    }

    /// Sends `method` to `url` with `headers` (each sent as given, repeats included) and `body`.
    public static func send(
        _ method: String, _ url: String, headers: [(String, String)] = [], body: String? = nil
    ) async throws -> Reply {
        let method = HTTPMethod(rawValue: method)
        if let target = URL(string: url), InProcessIdPNetwork.serves(target) {
            switch await InProcessIdPNetwork.exchange(
                method: method, url: target, headers: HTTPHeaders(headers), body: body ?? "", timeout: 10)
            {
            case .answer(let answer):
                return Reply(
                    status: Int(answer.status.code), headers: answer.allHeaders.map { ($0.0, $0.1) },
                    body: answer.body)
            case .refused: throw HarnessError("no in-process server at \(url)")
            case .timedOut: throw HarnessError("the in-process server at \(url) did not answer")
            }
        }
        var request = HTTPClientRequest(url: url)
        request.method = method
        request.headers = HTTPHeaders(headers)
        if let body { request.body = .bytes(ByteBuffer(string: body)) }
        let client = HTTPClient(
            eventLoopGroupProvider: .singleton,
            configuration: HTTPClient.Configuration(
                redirectConfiguration: .disallow, timeout: .init(connect: .seconds(5))))
        do {
            let response = try await client.execute(request, deadline: .now() + .seconds(10))
            let body = try await response.body.collect(upTo: 1 << 20)
            try await client.shutdown()
            return Reply(
                status: Int(response.status.code), headers: response.headers.map { ($0.name, $0.value) },
                body: String(buffer: body))
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    /// Posts the form `fields` (`application/x-www-form-urlencoded`) with `headers`.
    public static func post(
        _ url: String, form fields: [(String, String)], headers: [(String, String)] = []
    ) async throws -> Reply {
        let form = fields.map { "\($0.0)=\(FormBody.escape($0.1))" }.joined(separator: "&")
        return try await send(
            "POST", url, headers: [("Content-Type", "application/x-www-form-urlencoded")] + headers, body: form)
    }
}
