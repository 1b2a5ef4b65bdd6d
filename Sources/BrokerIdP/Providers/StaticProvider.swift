import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// Settings of a `static` account: there are none.
public struct StaticSettings: Codable, Sendable, Equatable {}

extension StaticSettings: ProviderSettings {
    package static let kind = "static"
    package static let fields: [ProviderField] = []
    package static let renewal = Renewal.pushedOnly

    package init(checking fields: ProviderFields) {}

    package func makeProvider(_ context: ProviderContext) -> any TokenProvider { StaticProvider() }
}

/// `static` accounts: tokens arrive only through `set_tokens`; there is nothing to refresh.
package struct StaticProvider: TokenProvider {
    package func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        .failure(.denial("a static account cannot refresh; push new tokens with brokerctl set-tokens (op set_tokens)"))
    }
}
