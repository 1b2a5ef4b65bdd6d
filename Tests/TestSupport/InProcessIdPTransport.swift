import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Foundation
import NIOHTTP1

/// The engine tests' IdP transport: every exchange is answered by a test IdP served in this
/// process (`TestIdPServing.inProcess`), with no socket and no waiting out of timeouts. An
/// address without an IdP is "connection refused", as a closed loopback port is.
public struct InProcessIdPTransport: IdPTransport {
    public init() {}

    public func exchange(_ request: IdPRequest) async -> Result<IdPAnswer, IdPTransportFailure> {
        switch await InProcessIdPNetwork.exchange(
            method: request.method, url: request.url, headers: request.headers, body: request.body ?? "",
            timeout: request.timeout)
        {
        case .refused: return .failure(.connectionRefused)
        case .timedOut: return .failure(.timedOut)
        case .answer(let answer):
            guard answer.body.utf8.count <= request.bodyLimit else { return .failure(.tooLarge) }
            return .success(
                IdPAnswer(
                    status: Int(answer.status.code), headers: HTTPHeaders(answer.allHeaders),
                    body: Data(answer.body.utf8)))
        }
    }

    public func shutdown() async {}
}

extension IdPClient {
    /// A client that reaches only the in-process test IdPs.
    public static func inProcess(settings: BrokerSettings = BrokerSettings()) -> IdPClient {
        IdPClient(settings: settings, transport: InProcessIdPTransport())
    }
}
