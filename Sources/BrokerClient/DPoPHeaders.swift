import BrokerProtocol

/// The header values of one request under a DPoP-bound token (RFC 9449 section 7.1), as
/// `BrokerClient.dpopHeaders` answers them: send `authorization` as `Authorization` and
/// `proof` as `DPoP`.
public struct DPoPHeaders: Sendable, Equatable {
    /// `DPoP <access token>`.
    public var authorization: String
    /// The proof for the request's method and URL.
    public var proof: String

    /// The headers of a `token` answer that carries a proof; a `BrokerError` when it carries
    /// none (a broker that does not speak DPoP).
    public init(_ token: TokenResult) throws {
        guard let proof = token.dpopProof else {
            throw BrokerError(.internal, "the broker answered without a DPoP proof")
        }
        authorization = "\(token.tokenType) \(token.accessToken)"
        self.proof = proof
    }
}
