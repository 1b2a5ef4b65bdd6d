import ArgumentParser
import BrokerProtocol

/// The provider settings `brokerctl add` and `brokerctl login` take: one option per field of
/// the provider kinds' `provider` objects (PROTOCOL.md section 7), named as the field with `-`
/// for `_`. The kind itself is each command's own option (`add` requires it, `login` defaults
/// to oauth2).
///
/// This is the one table to extend when a kind gains a field: brokerctl links only the client
/// library and the wire types, not the broker's registry of kinds, and ArgumentParser declares
/// options statically. The broker checks what the options give, as it does for any client.
struct ProviderOptions: ParsableArguments {
    @Option(help: "oauth2: the token endpoint URL.") var tokenEndpoint: String?
    @Option(help: "oauth2: an OIDC issuer URL, instead of --token-endpoint.") var issuer: String?
    @Option(help: "oauth2: the client id.") var clientID: String?
    @Option(
        help: "oauth2: client_secret_basic, client_secret_post or none.",
        completion: .list(["client_secret_basic", "client_secret_post", "none"]))
    var clientAuth: String?
    @Option(help: "oauth2: scope to request.") var scope: String?
    @Option(help: "oauth2: RFC 7009 revocation endpoint for logout (discovered with --issuer).")
    var revocationEndpoint: String?
    @Option(help: "oauth2: the authorization endpoint for brokerctl login --flow browser (discovered with --issuer).")
    var authorizationEndpoint: String?
    @Option(help: "oauth2: the RFC 8628 device authorization endpoint for brokerctl login (discovered with --issuer).")
    var deviceAuthorizationEndpoint: String?
    @Option(help: "oauth2: ES256 to bind the account's tokens to a key the broker makes and keeps (DPoP, RFC 9449).")
    var dpop: String?
    @Option(
        name: .customLong("dpop-allow"),
        help: ArgumentHelp(
            "oauth2: a URL on the IdP's origin that programs may get DPoP proofs for (a userinfo endpoint); repeat it "
                + "for more (with update, the list replaces the one before).",
            valueName: "url"))
    var dpopAllow: [String] = []
    @Option(help: "refresh_url: GET (default) or POST.") var method: String?
    @Option(help: "sliding: the refresh endpoint URL.") var endpoint: String?
    @Option(help: "sliding: IANA time zone of timestamps without a zone (default UTC).") var timezone: String?
    @Option(
        name: .customLong("command"), parsing: .unconditionalSingleValue,
        help: ArgumentHelp("exec: one argument of the command to run; repeat it, program first.", valueName: "arg"))
    var command: [String] = []
    @Option(help: "file: absolute path of the JSON token file another program keeps.") var path: String?

    /// The `provider` object of kind `kind` these options give.
    func spec(kind: String) -> ProviderSpec {
        let texts = [
            ("token_endpoint", tokenEndpoint), ("issuer", issuer), ("client_id", clientID), ("client_auth", clientAuth),
            ("scope", scope), ("revocation_endpoint", revocationEndpoint),
            ("authorization_endpoint", authorizationEndpoint),
            ("device_authorization_endpoint", deviceAuthorizationEndpoint), ("dpop", dpop), ("method", method),
            ("endpoint", endpoint),
            ("timezone", timezone), ("path", path),
        ]
        var spec = ProviderSpec(kind: kind)
        for case (let name, let value?) in texts { spec[name] = .string(value) }
        if !command.isEmpty { spec["command"] = .array(command.map(JSONValue.string)) }
        if !dpopAllow.isEmpty { spec["dpop_allow"] = .array(dpopAllow.map(JSONValue.string)) }
        return spec
    }
}
