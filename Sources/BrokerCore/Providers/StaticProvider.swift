import FoundationEssentials

/// Settings of a `static` account: there are none.
public struct StaticSettings: Codable, Sendable, Equatable {}

extension StaticSettings: ProviderSettings {
    static let kind = "static"
    static let fields: [ProviderField] = []
    static let renewal = Renewal.pushedOnly

    init(checking fields: ProviderFields) {}

    func makeProvider(_ context: ProviderContext) -> any TokenProvider { StaticProvider() }
}

/// `static` accounts: tokens arrive only through `set_tokens`; there is nothing to refresh.
struct StaticProvider: TokenProvider {
    func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        .failure(.denial("a static account cannot refresh; push new tokens with brokerctl set-tokens (op set_tokens)"))
    }
}
