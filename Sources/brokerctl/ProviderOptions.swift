import ArgumentParser
import BrokerProtocol

/// The provider settings `brokerctl add` takes: one option per field of the provider kinds'
/// `provider` objects (PROTOCOL.md section 7), named as the field with `-` for `_`.
///
/// This is the one table to extend when a kind gains a field: brokerctl links only the client
/// library and the wire types, not the broker's registry of kinds, and ArgumentParser declares
/// options statically. The broker checks what the options give, as it does for any client.
struct ProviderOptions: ParsableArguments {
    @Option(help: "Provider kind: oauth2, refresh_url, sliding, exec, file or static.") var kind: String
    @Option(help: "oauth2: the token endpoint URL.") var tokenEndpoint: String?
    @Option(help: "oauth2: an OIDC issuer URL, instead of --token-endpoint.") var issuer: String?
    @Option(help: "oauth2: the client id.") var clientID: String?
    @Option(help: "oauth2: client_secret_basic, client_secret_post or none.") var clientAuth: String?
    @Option(help: "oauth2: scope to request.") var scope: String?
    @Option(help: "oauth2: RFC 7009 revocation endpoint for logout (discovered with --issuer).")
    var revocationEndpoint: String?
    @Option(help: "refresh_url: GET (default) or POST.") var method: String?
    @Option(help: "sliding: the refresh endpoint URL.") var endpoint: String?
    @Option(help: "sliding: IANA time zone of timestamps without a zone (default UTC).") var timezone: String?
    @Option(
        name: .customLong("command"), parsing: .unconditionalSingleValue,
        help: ArgumentHelp("exec: one argument of the command to run; repeat it, program first.", valueName: "arg"))
    var command: [String] = []
    @Option(help: "file: absolute path of the JSON token file another program keeps.") var path: String?

    /// The `provider` object these options give.
    var spec: ProviderSpec {
        let texts = [
            ("token_endpoint", tokenEndpoint), ("issuer", issuer), ("client_id", clientID), ("client_auth", clientAuth),
            ("scope", scope), ("revocation_endpoint", revocationEndpoint), ("method", method), ("endpoint", endpoint),
            ("timezone", timezone), ("path", path),
        ]
        var spec = ProviderSpec(kind: kind)
        for case (let name, let value?) in texts { spec[name] = .string(value) }
        if !command.isEmpty { spec["command"] = .array(command.map(JSONValue.string)) }
        return spec
    }
}
