import BrokerModel
import BrokerSecrets
import FoundationEssentials
import NIOHTTP1

/// One HTTP exchange with an identity provider, below `IdPClient`'s checks: `IdPClient` decides
/// whether a URL may be called, what a failure message names and how an answer is read;
/// a transport only carries the request and brings back the answer, or why it could not.
/// `HTTPIdPTransport` is the broker's; the engine's tests answer in process.
public protocol IdPTransport: Sendable {
    /// Sends `request` and reads the whole answer, at most `request.bodyLimit` bytes, within
    /// `request.timeout` seconds.
    func exchange(_ request: IdPRequest) async -> Result<IdPAnswer, IdPTransportFailure>

    /// Closes idle connections; called once before exit.
    func shutdown() async
}

/// A request `IdPClient` has checked and hands to its transport.
public struct IdPRequest: Sendable {
    public var method: HTTPMethod
    public var url: URL
    public var headers: HTTPHeaders
    public var body: String?
    /// The longest answer body read; a longer one is `IdPTransportFailure.tooLarge`.
    public var bodyLimit: Int
    /// Seconds from sending to the whole answer; later is `IdPTransportFailure.timedOut`.
    public var timeout: TimeInterval
    /// Whether the answer carries no secret (a discovery document): a transport that wipes the
    /// buffers of token answers may leave these as they are.
    public var isPublic: Bool
}

/// What the IdP answered, read whole.
public struct IdPAnswer: Sendable {
    public var status: Int
    public var headers: HTTPHeaders
    public var body: Data

    public init(status: Int, headers: HTTPHeaders, body: Data) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// Why no answer came, for people ("connection refused", "timed out"): never a Swift type's
/// name, a header's value or anything else that might carry a secret.
public struct IdPTransportFailure: Error, Sendable, Equatable {
    public var reason: String

    public init(reason: String) { self.reason = reason }

    public static let timedOut = IdPTransportFailure(reason: "timed out")
    public static let connectionRefused = IdPTransportFailure(reason: "connection refused")
    public static let tooLarge = IdPTransportFailure(reason: "the answer is longer than 1 MiB")
}
