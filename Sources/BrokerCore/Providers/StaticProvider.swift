import FoundationEssentials

/// `static` accounts: tokens arrive only through `set_tokens`; there is nothing to refresh.
struct StaticProvider: TokenProvider {
    func refresh(_ record: AccountRecord, now: Date) async -> Result<Grant, RefreshFailure> {
        .failure(.denial("a static account cannot refresh; push new tokens with set_tokens"))
    }
}
