@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Testing
import TestSupport

/// The advice for an account that serves no token is worked out from what can work for it: a
/// flow only when its endpoint is known, a push when no sign-in can run, the command of the
/// kind's own credential. (AdviceTests runs each command against a real brokerd.)
@Suite struct RestorationTests {
    static let idp = "https://idp.example"

    static func settings(_ fields: [String: String]) throws -> any ProviderSettings {
        var spec = ProviderSpec(kind: "oauth2", ["client_id": .string("cli")])
        for (name, value) in fields { spec[name] = .string(value) }
        return try ProviderConfig.checking(spec).0.settings
    }

    static func discovered(browser: Bool, device: Bool) -> DiscoveredEndpoints {
        DiscoveredEndpoints(
            token: URL(string: idp + "/token")!, revocation: nil,
            authorization: browser ? URL(string: idp + "/authorize") : nil,
            deviceAuthorization: device ? URL(string: idp + "/device") : nil)
    }

    @Test func anOAuth2AccountGetsTheFlowsItsEndpointsAllow() throws {
        let token = ["token_endpoint": Self.idp + "/token"]
        let browser = ["authorization_endpoint": Self.idp + "/authorize"]
        let device = ["device_authorization_endpoint": Self.idp + "/device"]
        let cases: [([String: String], Restoration)] = [
            (token, .push(field: "refresh_token", noSignIn: true)),
            (token.merging(browser) { $1 }, .signIn(flow: .browser)),
            (token.merging(device) { $1 }, .signIn(flow: .device)),
            (token.merging(browser) { $1 }.merging(device) { $1 }, .signIn(flow: nil)),
        ]
        for (fields, expected) in cases {
            #expect(try Self.settings(fields).restoration(discovered: nil) == expected, "\(fields.keys.sorted())")
        }
    }

    @Test func anIssuerAccountGetsWhatItsDocumentNamesOnceRead() throws {
        let issuer = try Self.settings(["issuer": Self.idp])
        // Not read yet: the login reads it, and says what works if its flow does not.
        #expect(issuer.restoration(discovered: nil) == .signIn(flow: nil))
        #expect(issuer.restoration(discovered: Self.discovered(browser: true, device: true)) == .signIn(flow: nil))
        #expect(
            issuer.restoration(discovered: Self.discovered(browser: true, device: false)) == .signIn(flow: .browser))
        #expect(issuer.restoration(discovered: Self.discovered(browser: false, device: true)) == .signIn(flow: .device))
        #expect(
            issuer.restoration(discovered: Self.discovered(browser: false, device: false))
                == .push(field: "refresh_token", noSignIn: true))
        // A configured endpoint counts without the document.
        let configured = try Self.settings(["issuer": Self.idp, "device_authorization_endpoint": Self.idp + "/d"])
        #expect(
            configured.restoration(discovered: Self.discovered(browser: false, device: false)) == .signIn(flow: .device)
        )
    }

    @Test func everyOtherKindPushesItsOwnCredentialOrAsksItsCommandAgain() throws {
        let specs: [(ProviderSpec, Restoration)] = [
            (ProviderSpec(kind: "static"), .push(field: "access_token", noSignIn: false)),
            (ProviderSpec(kind: "refresh_url"), .push(field: "refresh_url", noSignIn: false)),
            (
                ProviderSpec(kind: "sliding", ["endpoint": .string(Self.idp + "/slide")]),
                .push(field: "refresh_token", noSignIn: false)
            ),
            (ProviderSpec(kind: "exec", ["command": .array([.string("/bin/true")])]), .askCommandAgain),
            (
                ProviderSpec(kind: "file", ["path": .string("/tmp/token.json")]),
                .push(field: "access_token", noSignIn: false)
            ),
        ]
        for (spec, expected) in specs {
            #expect(
                try ProviderConfig.checking(spec).0.settings.restoration(discovered: nil) == expected, "\(spec.kind)")
        }
    }

    @Test func eachAdviceNamesItsCommandInItsSentence() {
        let all: [Restoration] = [
            .signIn(flow: nil), .signIn(flow: .browser), .push(field: "refresh_token", noSignIn: true),
            .push(field: "access_token", noSignIn: false), .correctClient(declared: true),
            .correctClient(declared: false), .askCommandAgain, .retry,
        ]
        for restoration in all {
            let command = restoration.command(for: "gh2")
            #expect(command.hasPrefix("brokerctl ") && command.contains(" gh2"))
            #expect(restoration.sentence(for: "gh2").contains(command))
        }
    }
}
