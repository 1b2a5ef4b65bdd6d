import ArgumentParser
import BrokerClient
import BrokerProtocol

/// `brokerctl header ACCOUNT`: the HTTP headers that carry the account's token; for a
/// DPoP-bound account, with the proof for one request (`--method`, `--url`).
struct Header: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "header",
        abstract: "Print \"Authorization: Bearer TOKEN\", e.g. for curl -H \"$(brokerctl header api)\".",
        discussion: """
            For an account whose tokens are DPoP-bound (dpop = "ES256"), give the request's --method and --url: \
            it prints "Authorization: DPoP TOKEN" and "DPoP: PROOF" on two lines, for curl -H @<(brokerctl header ...).
            """)

    @OptionGroup var options: BridgeOptions
    @OptionGroup var narrowing: Narrowing
    @Option(help: "DPoP: the HTTP method of the request the proof is for (GET, POST, ...).") var method: String?
    @Option(help: "DPoP: the URL of the request the proof is for (https, or http on loopback).") var url: String?
    @Option(help: "DPoP: the nonce the resource server gave (its DPoP-Nonce header).") var nonce: String?
    @Flag(help: "When no token lasts --min-ttl, print the freshest one with a warning on stderr, and exit 0.")
    var bestEffort = false
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func validate() throws {
        if (method == nil) != (url == nil) { throw ValidationError("give --method and --url together") }
        if nonce != nil, method == nil { throw ValidationError("--nonce goes with --method and --url") }
    }

    func run() throws {
        guard let method, let url else {
            let token = try GlobalOptions.reportingFailures {
                try BestEffort.token(minTTL: options.minTTL, enabled: bestEffort) { minTTL in
                    var options = options
                    options.minTTL = minTTL
                    return try options.token(of: account, narrowing: narrowing)
                }
            }
            StandardStream.output.write("Authorization: \(token.tokenType) \(token.accessToken)\n")
            return
        }
        let headers = try GlobalOptions.reportingFailures {
            try DPoPHeaders(
                options.token(
                    of: account, narrowing: narrowing, dpop: DPoPRequest(htm: method, htu: url, nonce: nonce)))
        }
        StandardStream.output.write("Authorization: \(headers.authorization)\nDPoP: \(headers.proof)\n")
    }
}
