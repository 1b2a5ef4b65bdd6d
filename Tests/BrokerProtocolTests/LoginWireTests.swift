import BrokerProtocol
import Foundation
import Testing

/// The wire shapes of `login` and of the id-token answer of `token` (protocol/PROTOCOL.md section 6, `login`).
@Suite struct LoginWireTests {
    static func object(_ data: Data) throws -> [String: Any] {
        try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    @Test func loginIsAnOwnerOperation() {
        #expect(Operation(rawValue: "login") == .login)
        #expect(Operation.login.isOwnerOnly)
        #expect(Operation.allCases.contains(.login))
    }

    @Test func loginRequestFieldsDecodeFromSnakeCase() throws {
        let line = """
            {"id":1,"op":"login","account":"work","flow":"browser","secrets_file":"/proc/42/fd/0",\
            "redirect_port":8400,"timeout":90.5,"provider":{"kind":"oauth2","issuer":"https://idp.example"}}
            """
        let request = try Wire.makeDecoder().decode(Request.self, from: Data(line.utf8))
        #expect(request.op == "login")
        #expect(request.flow == "browser")
        #expect(LoginFlow(rawValue: request.flow ?? "") == .browser)
        #expect(request.secretsFile == "/proc/42/fd/0")
        #expect(request.redirectPort == 8400)
        #expect(request.timeout == 90.5)
        #expect(request.provider?["issuer"] == "https://idp.example")
        #expect(request.idToken == nil)
    }

    @Test func requestRoundTripsTheNewFields() throws {
        let request = Request(
            id: .integer(3), op: "login", account: "work", flow: "device", secretsFile: "/home/u/secrets.json",
            redirectPort: 1, timeout: 3600, idToken: true)
        let data = try Wire.makeEncoder().encode(request)
        let object = try Self.object(data)
        #expect(object["flow"] as? String == "device")
        #expect(object["secrets_file"] as? String == "/home/u/secrets.json")
        #expect((object["redirect_port"] as? NSNumber)?.intValue == 1)
        #expect((object["timeout"] as? NSNumber)?.doubleValue == 3600)
        #expect(object["id_token"] as? Bool == true)
        let decoded = try Wire.makeDecoder().decode(Request.self, from: data)
        #expect(decoded.flow == "device" && decoded.secretsFile == "/home/u/secrets.json")
        #expect(decoded.redirectPort == 1 && decoded.timeout == 3600 && decoded.idToken == true)
    }

    @Test(arguments: [
        #"{"op":"login","redirect_port":1.5}"#, #"{"op":"login","redirect_port":"80"}"#,
        #"{"op":"login","timeout":"60"}"#, #"{"op":"token","id_token":"yes"}"#, #"{"op":"login","flow":1}"#,
        #"{"op":"login","secrets_file":["/a"]}"#,
    ])
    func wrongTypesAreRefused(line: String) {
        #expect(throws: DecodingError.self) { try Wire.makeDecoder().decode(Request.self, from: Data(line.utf8)) }
    }

    @Test func deviceCodeProgressLineHasIDAndEventButNoOK() throws {
        let progress = LoginProgress(
            event: .deviceCode, verificationURI: "https://idp/device",
            verificationURIComplete: "https://idp/device?user_code=WDJB-MJHT", userCode: "WDJB-MJHT", expiresIn: 600,
            interval: 5)
        var data = try Wire.makeEncoder().encode(LoginProgressLine(id: .integer(1), progress: progress))
        let object = try Self.object(data)
        #expect((object["id"] as? NSNumber)?.intValue == 1)
        #expect(object["event"] as? String == "device_code")
        #expect(object["verification_uri"] as? String == "https://idp/device")
        #expect(object["verification_uri_complete"] as? String == "https://idp/device?user_code=WDJB-MJHT")
        #expect(object["user_code"] as? String == "WDJB-MJHT")
        #expect((object["expires_in"] as? NSNumber)?.intValue == 600)
        #expect((object["interval"] as? NSNumber)?.intValue == 5)
        #expect(object["ok"] == nil && object["url"] == nil)
        // What a client reads first: no `ok`, an `event`.
        let head = try Wire.makeDecoder().decode(ResponseHead.self, from: data)
        #expect(head.ok == nil && head.event == "device_code" && head.id == .integer(1))
        #expect(try Wire.makeDecoder().decode(LoginProgress.self, from: data) == progress)
        data.append(0x0A)
        #expect(!String(decoding: data.dropLast(), as: UTF8.self).contains("\n"))
    }

    @Test func slowDownAndAuthorizationURLProgressRoundTrip() throws {
        let slow = LoginProgress(event: .slowDown, interval: 10)
        let slowData = try Wire.makeEncoder().encode(LoginProgressLine(id: .string("a"), progress: slow))
        #expect(String(decoding: slowData, as: UTF8.self) == #"{"event":"slow_down","id":"a","interval":10}"#)
        #expect(try Wire.makeDecoder().decode(LoginProgress.self, from: slowData) == slow)

        let url = LoginProgress(
            event: .authorizationURL, expiresIn: 180, url: "https://idp/authorize?response_type=code&state=x",
            redirectURI: "http://127.0.0.1:41234/callback")
        let urlData = try Wire.makeEncoder().encode(LoginProgressLine(id: .integer(2), progress: url))
        let object = try Self.object(urlData)
        #expect(object["event"] as? String == "authorization_url")
        #expect(object["url"] as? String == "https://idp/authorize?response_type=code&state=x")
        #expect(object["redirect_uri"] as? String == "http://127.0.0.1:41234/callback")
        #expect(object["verification_uri"] == nil && object["user_code"] == nil)
        #expect(try Wire.makeDecoder().decode(LoginProgress.self, from: urlData) == url)
    }

    @Test func loginResultLineRoundTrips() throws {
        let result = LoginResult(account: "work", state: "valid", idToken: true)
        let line = try Wire.successLine(id: .integer(1), result: result, encoder: Wire.makeEncoder())
        #expect(
            String(decoding: line, as: UTF8.self)
                == #"{"id":1,"ok":true,"result":{"account":"work","id_token":true,"state":"valid"}}"# + "\n")
        let body = try Wire.makeDecoder().decode(ResultBody<LoginResult>.self, from: line)
        #expect(body.result == result)
    }

    @Test func idTokenResultRoundTripsWithAndWithoutExpiry() throws {
        let expiring = IDTokenResult(
            account: "work", idToken: "e30.eyJleHAiOjF9.", expiresAt: WireTests.instant, expiresIn: 299)
        let data = try Wire.makeEncoder().encode(expiring)
        let object = try Self.object(data)
        #expect(object["id_token"] as? String == "e30.eyJleHAiOjF9.")
        #expect(object["expires_at"] as? String == "2026-11-23T08:30:00Z")
        #expect((object["expires_in"] as? NSNumber)?.intValue == 299)
        #expect(try Wire.makeDecoder().decode(IDTokenResult.self, from: data) == expiring)

        let bare = IDTokenResult(account: "work", idToken: "opaque")
        let bareData = try Wire.makeEncoder().encode(bare)
        #expect(String(decoding: bareData, as: UTF8.self) == #"{"account":"work","id_token":"opaque"}"#)
        #expect(try Wire.makeDecoder().decode(IDTokenResult.self, from: bareData) == bare)
    }
}
