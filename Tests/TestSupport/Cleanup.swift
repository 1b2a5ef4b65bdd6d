/// Runs `body`, then `cleanup` on every way out: `defer` cannot await, and a test server
/// (an IdP) left running would outlive the test.
public func withCleanup<T>(_ body: () async throws -> T, cleanup: () async -> Void) async throws -> T {
    let result: T
    do {
        result = try await body()
    } catch {
        await cleanup()
        throw error
    }
    await cleanup()
    return result
}
