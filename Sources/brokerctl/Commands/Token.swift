import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token",
        abstract:
            "Print an access token (only the token), e.g. for curl -H \"Authorization: Bearer $(brokerctl token api)\"."
    )

    @OptionGroup var options: GlobalOptions
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String
    @Option(help: "Seconds the token must stay valid.") var minTTL: Double?
    @Flag(help: "Print the account's OpenID Connect id token instead (exit 4 when its IdP issued none).")
    var idToken = false
    @Flag(help: "When no token lasts --min-ttl, print the freshest one with a warning on stderr, and exit 0.")
    var bestEffort = false
    @OptionGroup var narrowing: Narrowing
    @Option(help: "DPoP: the HTTP method of the request to prove (with --dpop-url; the proof follows the token).")
    var dpopMethod: String?
    @Option(help: "DPoP: the URL of the request to prove (https, or http on loopback).") var dpopURL: String?
    @Option(help: "DPoP: the nonce the resource server gave.") var dpopNonce: String?

    func validate() throws {
        if idToken, narrowing.scope != nil || narrowing.resource != nil || dpopMethod != nil || bestEffort {
            throw ValidationError("--id-token takes no --scope, --resource, --dpop-method or --best-effort")
        }
        if (dpopMethod == nil) != (dpopURL == nil) {
            throw ValidationError("give --dpop-method and --dpop-url together")
        }
        if dpopNonce != nil, dpopMethod == nil { throw ValidationError("--dpop-nonce goes with --dpop-method") }
    }

    func run() throws {
        if idToken {
            try options.run(.idToken(account: account, minTTL: minTTL)) { $0.idToken }
        } else {
            let dpop = dpopMethod.map { DPoPRequest(htm: $0, htu: dpopURL, nonce: dpopNonce) }
            let token = try GlobalOptions.reportingFailures(account: account, socket: options.socket) {
                try BestEffort.token(minTTL: minTTL, enabled: bestEffort) { minTTL in
                    try options.client().perform(
                        .token(
                            account: account, minTTL: minTTL, scope: narrowing.scope, resource: narrowing.resource,
                            dpop: dpop))
                }
            }
            try options.show(token) { token in
                token.dpopProof.map { token.accessToken + "\n" + $0 } ?? token.accessToken
            }
        }
    }
}
