@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import FuzzSupport

/// Each provider's reading of an IdP or helper answer, then what the broker does next with
/// a grant (schedule the next refresh, serve the token). The first byte picks the reader,
/// the next few the status, `Retry-After` and clock; the rest is the body.
let now = Date(timeIntervalSince1970: 1_800_000_000)
let issuer = URL(string: "https://idp.example/tenant")!
let refreshURL = URL(string: "https://api.example/refresh/abc")!
let planner = RefreshPlanner(settings: BrokerSettings())
let zones = ["UTC", "Europe/Berlin", "America/St_Johns", "Pacific/Kiritimati"].compactMap {
    IANATimeZone(identifier: $0)
}
let statuses = [200, 200, 200, 201, 204, 299, 400, 401, 403, 404, 429, 500, 503, 0, 99, 600]

/// One input, as libFuzzer hands it over.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let reader = input.byte() % 7
    let status = input.pick(statuses)
    let retryAfter: TimeInterval? =
        switch input.byte() % 3 {
        case 0: nil
        case 1: input.double()
        default: TimeInterval(input.byte())
        }
    let lifetime = input.pick([600.0, 3600, 1])
    let body = Data(input.rest())
    let reply = IdPReply(status: status, body: body, retryAfter: retryAfter)
    let grant: Result<Grant, RefreshFailure>
    switch reader {
    case 0: grant = OAuth2Provider.interpret(reply, now: now, defaultLifetime: lifetime)
    case 1: grant = RefreshURLProvider.interpret(reply, from: refreshURL, now: now, defaultLifetime: lifetime)
    case 2:
        grant = SlidingProvider.interpret(
            reply, now: now, timeZone: zones[status % zones.count], defaultLifetime: lifetime)
    case 3:
        let endings: [ExecOutput.Ending] = [
            .exited(0), .exited(Int32(status) - 100), .exited(2), .signalled(9), .timedOut, .outputTooLarge,
            .launchFailed("fuzz"),
        ]
        let output = ExecOutput(ending: endings[status % endings.count], stdout: body)
        grant = ExecProvider.interpret(output, now: now, defaultLifetime: lifetime, timeout: 30)
    case 4:
        _ = OAuth2Provider.interpretRevocation(reply)
        return 0
    case 5:
        _ = DiscoveryCache.interpret(reply, issuer: issuer)
        return 0
    default:
        _ = IdPClient.retryAfter(String(decoding: body, as: UTF8.self))
        return 0
    }
    if case .success(let grant) = grant {
        _ = planner.nextRefresh(token: grant.token, refreshExpiresAt: grant.refreshExpiresAt, now: now)
        _ = (try? PreparedToken(account: "fuzz", token: grant.token, dpop: nil))?.line(id: .integer(1), now: now)
    }
    return 0
}

runFuzzer(fuzzOne)
