import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// How an account is refreshed: checked settings of one provider kind (no secrets).
///
/// The vault stores it in the shape Swift's synthesized coding gave the enum that listed the
/// kinds before the registry: `{"oauth2": {"_0": {settings}}}`, or `{"static": {}}` for a
/// kind without settings. Both shapes are read; the first is written.
public struct ProviderConfig: Codable, Sendable, Equatable {
    package let settings: any ProviderSettings

    package init(_ settings: some ProviderSettings) { self.settings = settings }

    /// The provider's kind as the protocol names it.
    public var kind: String { type(of: settings).kind }

    /// Whether its kind authenticates its client with a secret (`client_secret`).
    package var takesClientSecret: Bool { type(of: settings).fields.contains(.clientSecret) }

    /// The name of the credential its kind refreshes with ("refresh token") when `secrets`
    /// lack it, else `nil`.
    package func missingCredential(in secrets: AccountSecrets) -> String? {
        guard let credential = type(of: settings).refreshCredential, secrets[keyPath: credential.secret] == nil
        else { return nil }
        return credential.name
    }

    /// How the engine keeps the account supplied with tokens.
    package var renewal: Renewal { type(of: settings).renewal }

    /// The provider of an account with these settings.
    package func makeProvider(_ context: ProviderContext) -> any TokenProvider { settings.makeProvider(context) }

    public static func == (lhs: ProviderConfig, rhs: ProviderConfig) -> Bool { lhs.settings.isEqual(to: rhs.settings) }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: StoredKey.self)
        guard container.allKeys.count == 1, let key = container.allKeys.first else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: container.codingPath, debugDescription: "provider settings hold one kind"))
        }
        guard let kind = ProviderKinds.stored(as: key.stringValue) else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: container.codingPath, debugDescription: "unknown provider kind \(key.stringValue)"))
        }
        let payload = try container.nestedContainer(keyedBy: StoredKey.self, forKey: key)
        let payloadKey = StoredKey("_0")
        let settingsDecoder =
            payload.contains(payloadKey)
            ? try payload.superDecoder(forKey: payloadKey) : try container.superDecoder(forKey: key)
        settings = try Self.decode(kind, from: settingsDecoder)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: StoredKey.self)
        var payload = container.nestedContainer(
            keyedBy: StoredKey.self, forKey: StoredKey(type(of: settings).storedName))
        try settings.encode(to: payload.superEncoder(forKey: StoredKey("_0")))
    }

    private static func decode<Settings: ProviderSettings>(_ kind: Settings.Type, from decoder: any Decoder) throws
        -> any ProviderSettings
    {
        try Settings(from: decoder)
    }

    /// A key of the stored shape: a kind's stored name, or `_0`.
    private struct StoredKey: CodingKey {
        let stringValue: String
        var intValue: Int? { nil }

        init(_ name: String) { stringValue = name }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }
}

extension ProviderConfig {
    /// Why a stored credential may not move from `self` to `new`, or `nil` when it may: the
    /// kind stays, so does whatever the kind says identifies the credential's client, and every
    /// origin the new settings would send it to is one the old settings sent it to already.
    package func credentialMove(to new: ProviderConfig) -> String? {
        guard kind == new.kind else { return "changes its kind from \(kind) to \(new.kind)" }
        if let reason = settings.credentialMove(toSettings: new.settings) { return reason }
        let known = Set(credentialOrigins)
        if let moved = new.credentialOrigins.first(where: { !known.contains($0) }) {
            let from = known.map(\.description).sorted().joined(separator: ", ")
            return "moves it to \(moved) (its credential was stored for \(from))"
        }
        return nil
    }

    /// The origins this provider sends an account's secrets to.
    private var credentialOrigins: [Origin] {
        settings.credentialURLs.compactMap { $0.flatMap(Origin.init) }
    }
}

extension ProviderConfig {
    /// Checks a provider object (of `add`, `update`, or a config table) with its kind's rules;
    /// returns its settings and the client secret it carried. Every field any kind knows is
    /// type-checked, whatever the kind. `holdsClientSecret`: the vault holds the account's client
    /// secret already, which client authentication may use.
    public static func checking(_ spec: ProviderSpec, holdsClientSecret: Bool = false) throws(BrokerFailure) -> (
        ProviderConfig, clientSecret: SecretBytes?
    ) {
        guard let kind = ProviderKinds.named(spec.kind) else {
            throw .invalid("unknown provider kind \"\(InputEcho.printable(spec.kind))\"; use \(ProviderKinds.names)")
        }
        let fields = ProviderFields(spec: spec, holdsClientSecret: holdsClientSecret)
        for field in ProviderKinds.fields { try fields.check(field) }
        let settings = try kind.init(checking: fields)
        let clientSecret = kind.fields.contains(.clientSecret) ? try fields.text(ProviderField.clientSecret.name) : nil
        return (ProviderConfig(settings), try clientSecret.map(SecretBytes.init))
    }
}
