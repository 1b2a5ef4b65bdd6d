import BrokerModel
import BrokerSecrets

/// Every provider kind the broker knows. Adding a kind is one file under `Providers/` with a
/// `ProviderSettings` type, and one line here.
package enum ProviderKinds {
    package static let all: [any ProviderSettings.Type] = [
        OAuth2Settings.self,
        RefreshURLSettings.self,
        SlidingSettings.self,
        ExecSettings.self,
        FileSettings.self,
        StaticSettings.self,
    ]

    /// The kind named `kind` in a `provider` object.
    package static func named(_ kind: String) -> (any ProviderSettings.Type)? {
        all.first { $0.kind == kind }
    }

    /// The kind whose settings the vault stores under `storedName`.
    package static func stored(as storedName: String) -> (any ProviderSettings.Type)? {
        all.first { $0.storedName == storedName }
    }

    /// The fields of every kind. Each one is type-checked in any `provider` object, whatever
    /// its kind, and may appear in any `[accounts.NAME]` table unless it is a secret.
    package static let fields: [ProviderField] = {
        var seen: Set<String> = []
        return all.flatMap { $0.fields }.filter { seen.insert($0.name).inserted }
    }()

    /// The kind names for messages: "oauth2, refresh_url, ... or static".
    package static var names: String {
        let names = all.map { $0.kind }
        return names.dropLast().joined(separator: ", ") + " or " + names.last!
    }
}
