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
