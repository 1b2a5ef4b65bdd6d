import Logging
import PostgresNIO

/// One transaction on the store: `body` runs between BEGIN and COMMIT, and is rolled back when
/// it throws. What `body` threw is thrown as it is (postgres-nio wraps it), so a refusal of the
/// store reads as the store's own message.
enum FleetTransaction {
    static func run<Result>(
        _ client: PostgresClient, logger: Logger, isolation: isolated (any Actor)? = #isolation,
        _ body: (PostgresConnection) async throws -> sending Result
    ) async throws -> sending Result {
        do {
            return try await client.withTransaction(logger: logger, isolation: isolation, body)
        } catch let error as PostgresTransactionError {
            if let cause = error.closureError { throw cause }
            throw error
        }
    }
}
