import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

#if canImport(Glibc)
import Glibc
#endif

/// A real IdP: django-oauth-toolkit 3.x under gunicorn, with refresh-token rotation and reuse
/// protection, started by the repository's launcher (`launcher`, a Python fixture run with the
/// virtualenv that scripts/install-deps makes) in a directory of its own. The launcher prints
/// the client and a first refresh token as one JSON line, then execs gunicorn: `stop` stops that
/// PID and waits for it.
public final class DjangoOAuthIdP: Sendable {
    /// Where scripts/install-deps installs django-oauth-toolkit and gunicorn.
    public static let venv = "/var/cache/tokenbroker-tests/idp-venv"
    public let directory: TemporaryDirectory
    public let address: String
    public let port: Int
    public let clientID: String
    public let clientSecret: String
    /// The first refresh token (a password grant's), for the account's `add`.
    public let initialRefreshToken: String
    private let launcher: String
    private let server: ChildProcess

    /// Whether the virtualenv is there.
    public static var isInstalled: Bool {
        access(venv + "/bin/gunicorn", X_OK) == 0 && access(venv + "/bin/python", X_OK) == 0
    }

    /// Starts the IdP on `address`:`port` (on a thread of its own) and waits until it answers.
    public static func start(
        launcher: String, address: String, port: Int, accessTokenSeconds: Int, graceSeconds: Int
    ) async throws -> DjangoOAuthIdP {
        try await onOwnThread {
            try DjangoOAuthIdP(
                launcher: launcher, address: address, port: port, accessTokenSeconds: accessTokenSeconds,
                graceSeconds: graceSeconds)
        }
    }

    private struct Started: Decodable {
        var clientId: String
        var clientSecret: String
        var refreshToken: String
    }

    private init(launcher: String, address: String, port: Int, accessTokenSeconds: Int, graceSeconds: Int) throws {
        let directory = try TemporaryDirectory()
        (self.directory, self.launcher, self.address, self.port) = (directory, launcher, address, port)
        let outputPath = directory.file("started.json")
        let output = open(outputPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        let log = open(directory.file("idp.log"), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        defer {
            close(output)
            close(log)
        }
        let server: ChildProcess
        do {
            server = try ChildProcess.spawn(
                Self.venv + "/bin/python",
                [
                    launcher, "serve", directory.path, "--bind", address, "--port", String(port),
                    "--access-token-seconds", String(accessTokenSeconds), "--grace-seconds", String(graceSeconds),
                ], environment: ["PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"], output: output, errors: log)
        } catch {
            directory.remove()
            throw error
        }
        self.server = server
        do {
            let started = try Self.waitUntilServing(server, outputPath, address: address, port: port)
            (clientID, clientSecret, initialRefreshToken) = (
                started.clientId, started.clientSecret, started.refreshToken
            )
        } catch {
            server.stop()
            let log = (try? String(contentsOfFile: directory.file("idp.log"), encoding: .utf8)) ?? ""
            directory.remove()
            throw HarnessError("the IdP did not start: \(error); its log: \(log.suffix(2000))")
        }
    }

    /// The token endpoint's path (the host and port are the proxy's, as the brokers see them).
    public static let tokenPath = "/o/token/"

    /// Stops gunicorn (SIGTERM, then SIGKILL), waits for it and removes its directory.
    public func stop() {
        server.stop()
        directory.remove()
    }

    /// What the IdP's own database holds (see the launcher's `state`).
    public struct Record: Decodable, Sendable {
        public struct RefreshToken: Decodable, Sendable {
            public var id: Int
            public var created: Double
            /// When it was revoked (by rotation, or by reuse protection); nil while it is the live one.
            public var revoked: Double?
            /// Whether a refresh consumed it (rotation); a revoked one not consumed was revoked by
            /// reuse protection (its family) or by hand.
            public var consumed: Bool
        }

        public struct AccessToken: Decodable, Sendable {
            public var token: String
            public var created: Double
            public var expires: Double
            /// When DOT deleted it (a revocation: rotation deletes the previous access token).
            public var deleted: Double?

            /// Whether the IdP held it active at some instant of `from...to`, `grace` seconds
            /// either side allowed for the clocks' granularity.
            public func wasActive(from: Date, to: Date, grace: Double) -> Bool {
                let end = min(expires, deleted ?? .infinity)
                return from.timeIntervalSince1970 - grace <= end && created <= to.timeIntervalSince1970 + grace
            }
        }

        public var refreshTokens: [RefreshToken]
        public var accessTokens: [AccessToken]
        /// Token requests gunicorn logged (every refresh the brokers made; the first token came
        /// from a password grant inside the launcher).
        public var tokenRequests: Int
    }

    /// Reads the IdP's database (read only, on a thread of its own).
    public func record() async throws -> Record {
        try await onOwnThread {
            let result = try ChildProcess.capture(
                Self.venv + "/bin/python", [self.launcher, "state", self.directory.path],
                environment: ["PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"], timeout: 60)
            guard result.status == 0 else { throw HarnessError("the IdP's state: \(result.stderr)") }
            let decoder = JSONDecoder()
            decoder.keyDecodingStrategy = .convertFromSnakeCase
            return try decoder.decode(Record.self, from: Data(result.stdout.utf8))
        }
    }

    /// Whether the IdP's introspection endpoint (RFC 7662) calls `token` active now.
    public func isActive(_ token: String) async throws -> Bool {
        var request = HTTPClientRequest(url: "http://\(address):\(port)/o/introspect/")
        request.method = .POST
        let basic = Data("\(clientID):\(clientSecret)".utf8).base64EncodedString()
        request.headers.add(name: "Authorization", value: "Basic " + basic)
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        let form = "token=" + (token.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")
        request.body = .bytes(ByteBuffer(string: form))
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(10))
        let body = try await response.body.collect(upTo: 1 << 16)
        guard response.status == .ok else { throw HarnessError("introspection answered \(response.status)") }
        let answer = try JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any]
        return answer?["active"] as? Bool == true
    }

    private static func waitUntilServing(_ server: ChildProcess, _ outputPath: String, address: String, port: Int)
        throws -> Started
    {
        var started: String?
        let serving = try Poll.blocking(timeout: 60, every: .milliseconds(50)) {
            if server.hasExited() { throw HarnessError("the launcher exited with \(server.wait())") }
            guard let text = try? String(contentsOfFile: outputPath, encoding: .utf8), text.hasSuffix("\n"),
                isAccepting(address: address, port: port)
            else { return false }
            started = text
            return true
        }
        guard serving, let started else { throw HarnessError("the IdP did not answer within 60 s") }
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return try decoder.decode(Started.self, from: Data(started.utf8))
    }

    private static func isAccepting(address: String, port: Int) -> Bool {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var target = sockaddr_in()
        target.sin_family = sa_family_t(AF_INET)
        target.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, address, &target.sin_addr)
        return withUnsafePointer(to: &target) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }
}
