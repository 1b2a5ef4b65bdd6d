extension Result {
    /// The error, when this is a failure.
    public var failure: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}

extension Result where Failure == any Error {
    /// The outcome of `body`, so that calls run together (`async let`) can each be checked.
    public init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}

/// Runs `body` with `value`, then `stop(value)`, whether `body` returned or threw: the frame of
/// every harness's `run`.
public func runThenStop<Value>(
    _ value: Value, stop: (Value) async -> Void, _ body: (Value) async throws -> Void
) async throws {
    do {
        try await body(value)
    } catch {
        await stop(value)
        throw error
    }
    await stop(value)
}
