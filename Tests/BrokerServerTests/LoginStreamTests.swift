@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
import BrokerServer
@testable import BrokerVault
import Foundation
import Logging
import Testing
import TestSupport

/// `login` on a real socket: progress lines, then the final line, on the request's connection;
/// the connection closing cancels the login. And the `token` answer with `"id_token": true`.
@Suite(.serialized) struct LoginStreamTests {
    /// Serves `harness.broker` on a socket in the harness's directory while `body` runs.
    static func serving(_ harness: BrokerHarness, _ body: (String) async throws -> Void) async throws {
        let path = harness.directory.file("broker.sock")
        let policy = AccessPolicy(rules: harness.broker.accessRules, logger: Logger(label: "test"))
        let (listening, ready) = AsyncStream.makeStream(of: Void.self)
        let server = SocketServer(
            address: .path(path), dispatcher: RequestDispatcher(broker: harness.broker, policy: policy),
            policy: policy, logger: Logger(label: "test"), limits: ConnectionLimits()
        ) { ready.finish() }
        let task = Task { try await server.run() }
        for await _ in listening {}
        do {
            try await body(path)
        } catch {
            task.cancel()
            _ = try? await task.value
            throw error
        }
        task.cancel()
        _ = try? await task.value
    }

    /// The next line as an object, read on a thread of its own (the connection's reads wait up
    /// to a minute, which only stops a hung test).
    static func next(_ connection: RawConnection) async throws -> [String: Any] {
        try #require(await connection.nextObject())
    }

    /// Whether `broker` runs no login, read on its actor.
    static func runsNoLogin(_ broker: isolated Broker) -> Bool { broker.logins.isEmpty }

    /// A connection to the broker at `path` whose reads wait up to a minute.
    static func connect(_ path: String) throws -> RawConnection {
        try RawConnection(path: path, readTimeout: 60)
    }

    static func loginLine(_ harness: BrokerHarness, flow: String, id: Int = 7) -> String {
        let provider = """
            {"kind":"oauth2","issuer":"\(harness.idp.issuer)","client_id":"\(harness.idp.clientID)",\
            "client_secret":"\(harness.idp.clientSecret)","scope":"openid offline_access"}
            """
        return #"{"id":\#(id),"op":"login","account":"work","flow":"\#(flow)","provider":\#(provider)}"# + "\n"
    }

    @Test func progressLinesComeBeforeTheFinalLineAndTheIDTokenIsAnsweredOnRequest() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            try await Self.serving(harness) { path in
                let connection = try Self.connect(path)
                #expect(connection.send(Self.loginLine(harness, flow: "device")))
                let progress = try await Self.next(connection)
                #expect(progress["id"] as? Int == 7)
                #expect(progress["event"] as? String == "device_code")
                #expect(progress["ok"] == nil)
                let complete = try #require(progress["verification_uri_complete"] as? String)
                #expect(complete.hasSuffix("user_code=" + (progress["user_code"] as? String ?? "?")))
                #expect(try await harness.idp.decide(.approve, at: complete) == 200)
                await harness.clock.advanceToNextWake(within: 1)

                let final = try await Self.next(connection)
                #expect(final["id"] as? Int == 7)
                #expect(final["ok"] as? Bool == true)
                let result = try #require(final["result"] as? [String: Any])
                #expect(result["account"] as? String == "work")
                #expect(result["state"] as? String == "valid")
                #expect(result["id_token"] as? Bool == true)

                #expect(connection.send(#"{"id":8,"op":"token","account":"work","id_token":true}"# + "\n"))
                let idAnswer = try #require(try await Self.next(connection)["result"] as? [String: Any])
                #expect(idAnswer["id_token"] as? String == harness.idp.issuedIDTokens.last)
                #expect(idAnswer["access_token"] == nil)
                #expect(idAnswer["expires_at"] is String && idAnswer["expires_in"] is Int)

                #expect(connection.send(#"{"id":9,"op":"token","account":"work"}"# + "\n"))
                let tokenAnswer = try #require(try await Self.next(connection)["result"] as? [String: Any])
                #expect(tokenAnswer["access_token"] as? String == harness.idp.issuedAccessTokens.last)
            }
        }
    }

    @Test func closingTheConnectionCancelsADeviceLogin() async throws {
        try await BrokerHarness.run { harness in
            harness.idp.setDeviceTiming(interval: 1)
            try await Self.serving(harness) { path in
                var connection: RawConnection? = try Self.connect(path)
                #expect(connection?.send(Self.loginLine(harness, flow: "device")) == true)
                let progress = try await Self.next(try #require(connection))
                await harness.clock.advanceToNextWake(within: 1)
                await harness.clock.sleepersReached(1)
                #expect(harness.idp.devicePolls.count == 1)
                connection = nil
                // Once the broker sees the connection close, the login ends, and with it its polls.
                #expect(await eventually { await Self.runsNoLogin(harness.broker) })
                _ = try await harness.idp.decide(
                    .approve, at: try #require(progress["verification_uri_complete"] as? String))
                harness.clock.advance(by: 60)
                #expect(harness.idp.devicePolls.count == 1)
                #expect(harness.idp.issuedRefreshTokens.isEmpty)
                await #expect(throws: BrokerError(.notFound, "")) { try await harness.broker.status(account: "work") }
            }
        }
    }

    @Test func closingTheConnectionClosesTheLoopbackListener() async throws {
        try await BrokerHarness.run { harness in
            try await Self.serving(harness) { path in
                var connection: RawConnection? = try Self.connect(path)
                #expect(connection?.send(Self.loginLine(harness, flow: "browser")) == true)
                let progress = try await Self.next(try #require(connection))
                #expect(progress["event"] as? String == "authorization_url")
                let redirect = try #require(progress["redirect_uri"] as? String)
                // The user got as far as the IdP; the browser never comes back.
                _ = try await TestBrowser().authorize(try #require(progress["url"] as? String))
                connection = nil
                let port = try #require(URLComponents(string: redirect)?.port)
                #expect(await eventually { !TestBrowser.isListening(port) })
                #expect(harness.idp.issuedRefreshTokens.isEmpty)
                await #expect(throws: BrokerError(.notFound, "")) { try await harness.broker.status(account: "work") }
            }
        }
    }

    @Test(arguments: [
        (#"{"id":1,"op":"login","account":"work"}"#, "flow"),
        (#"{"id":1,"op":"login","account":"work","flow":"magic"}"#, "device or browser"),
        (#"{"id":1,"op":"login","account":"work","flow":"browser","redirect_port":0}"#, "redirect_port"),
        (#"{"id":1,"op":"login","account":"work","flow":"browser","redirect_port":65536}"#, "redirect_port"),
        (#"{"id":1,"op":"login","account":"work","flow":"device","timeout":0}"#, "timeout"),
        (#"{"id":1,"op":"login","account":"work","flow":"device","timeout":3601}"#, "timeout"),
        (#"{"id":1,"op":"login","account":"work","flow":"device","timeout":1e999}"#, "wrong type"),
        (#"{"id":1,"op":"login","flow":"device"}"#, "account"),
        (#"{"id":1,"op":"login","account":"work","flow":"device","secrets_file":"/proc/1/fd/0"}"#, "/proc"),
    ])
    func badLoginRequestsAreRefusedAtOnce(line: String, mentions: String) async throws {
        try await BrokerHarness.run { harness in
            try await Self.serving(harness) { path in
                let connection = try RawConnection(path: path)
                #expect(connection.send(line + "\n"))
                let answer = try await Self.next(connection)
                #expect(answer.errorCode == "bad_request")
                let message = (answer["error"] as? [String: Any])?["message"] as? String ?? ""
                #expect(message.contains(mentions), "\(message)")
            }
        }
    }
}
