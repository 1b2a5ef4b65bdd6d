import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials
import Logging

/// One provider kind, declared by the type of its settings: its name, the fields of its
/// `provider` object and how they are checked, whether and how the engine renews its tokens,
/// and how its provider is built. Each kind is one file under `Providers/`, listed once in
/// `ProviderKinds.all`.
package protocol ProviderSettings: Codable, Sendable, Equatable {
    /// The kind's name in `provider` objects, config files and `status` (`"oauth2"`).
    static var kind: String { get }
    /// The name the vault stores the settings under. Vaults of today hold the case names of the
    /// enum that listed the kinds before this registry (`refreshURL` for `refresh_url`).
    static var storedName: String { get }
    /// The fields of the `provider` object it reads, which are also the keys its
    /// `[accounts.NAME]` table of the config file may hold (except secrets).
    static var fields: [ProviderField] { get }
    /// How the engine keeps its accounts supplied with tokens.
    static var renewal: Renewal { get }
    /// The secret a refresh presents, named for people ("refresh token"); `nil` for kinds
    /// whose refresh presents none the broker holds.
    static var refreshCredential: (name: String, secret: KeyPath<AccountSecrets, SecretBytes?>)? { get }

    /// Checked settings from a `provider` object; a bad field is a `bad_request` naming it.
    init(checking fields: ProviderFields) throws(BrokerFailure)

    /// The provider of one account with these settings.
    func makeProvider(_ context: ProviderContext) -> any TokenProvider

    /// The URLs these settings send an account's secrets to (its credential stays with their origins).
    var credentialURLs: [URL?] { get }

    /// Why a stored credential may not move from these settings to `new` beyond a change of
    /// origin (which every kind is checked for), or `nil` when it may.
    func credentialMove(to new: Self) -> String?

    /// What brings back an account of these settings that serves no token; `discovered` is
    /// what its issuer's discovery document named, if it has one and it was read.
    func restoration(discovered: DiscoveredEndpoints?) -> Restoration

    /// The settings as the fields of a `provider` object (no secret) with `changes` made (a
    /// `null` removes a field), for `update` to check again; `nil` for a kind it does not change.
    func fieldValues(changedBy changes: [String: JSONValue]) -> [String: JSONValue]?
}

extension ProviderSettings {
    package static var storedName: String { kind }

    package static var refreshCredential: (name: String, secret: KeyPath<AccountSecrets, SecretBytes?>)? { nil }

    package var credentialURLs: [URL?] { [] }

    package func credentialMove(to new: Self) -> String? { nil }

    /// Pushing the credential the kind refreshes with, or an access token for a kind without one.
    package func restoration(discovered: DiscoveredEndpoints?) -> Restoration {
        guard let credential = Self.refreshCredential?.secret else {
            return .push(field: "access_token", noSignIn: false)
        }
        return .push(field: credential == \AccountSecrets.refreshURL ? "refresh_url" : "refresh_token", noSignIn: false)
    }

    package func fieldValues(changedBy changes: [String: JSONValue]) -> [String: JSONValue]? { nil }

    /// Whether `other` holds the same settings of the same kind.
    package func isEqual(to other: any ProviderSettings) -> Bool { (other as? Self) == self }

    /// `credentialMove(to:)` for settings known only to be of some kind; `nil` across kinds.
    package func credentialMove(toSettings other: any ProviderSettings) -> String? {
        (other as? Self).flatMap { credentialMove(to: $0) }
    }
}

/// How the engine keeps the accounts of a kind supplied with tokens.
package enum Renewal: Sendable, Equatable {
    /// Only a person supplies tokens (`set_tokens`): nothing is refreshed, and an account with
    /// no token valid long enough needs a login.
    case pushedOnly
    /// The provider obtains new tokens (from an IdP or a helper): the engine refreshes before
    /// expiry, on demand and with `refresh`, and backs off after transient failures.
    case refreshes
    /// Another program renews the token in a source the provider reads (a file): every
    /// `pollInterval` seconds the engine asks the provider whether the source changed and reads
    /// it when it did, as it also does on demand, with `refresh`, and when the token expires.
    case watches(pollInterval: TimeInterval)

    /// Whether another program renews the tokens (`watches`).
    package var watchesSource: Bool {
        if case .watches = self { return true }
        return false
    }
}

/// One field of a `provider` object: its wire name and the JSON type it takes.
package struct ProviderField: Sendable, Equatable {
    package enum ValueType: Sendable, Equatable {
        /// A string.
        case text
        /// An array of strings.
        case texts
    }

    package var name: String
    package var type: ValueType
    /// A secret (stored in the vault, never in a config file).
    package var isSecret = false

    /// The client secret a kind may take (stored in the vault as the account's client secret).
    package static let clientSecret = ProviderField(name: "client_secret", type: .text, isSecret: true)
}

/// What providers are built with.
package struct ProviderContext: Sendable {
    /// The HTTP client every IdP call goes through.
    package var http: IdPClient
    /// The engine's settings (timeouts, the lifetime of tokens issued without one).
    package var settings: BrokerSettings
    package var logger: Logger

    /// Every stored member, as the synthesized initializer (internal to its module) takes them.
    package init(http: IdPClient, settings: BrokerSettings, logger: Logger) {
        self.http = http
        self.settings = settings
        self.logger = logger
    }
}
