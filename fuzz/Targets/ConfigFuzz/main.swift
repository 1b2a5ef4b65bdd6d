@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import Dispatch
import FoundationEssentials
import FuzzSupport
import Logging

/// `broker.toml`: the parser, then what brokerd builds from a configuration it accepted at
/// start: the IdP client (timeouts), the broker (event buffer, schedule) on an empty vault,
/// and each account's provider settings. Nothing is configured into the broker, so no
/// account refreshes and nothing is sent anywhere.
let logger = Logger(label: "fuzz") { _ in SwiftLogNoOpLogHandler() }
let vault = try! Vault(
    path: scratchDirectory("config") + "/vault", key: SecretKey(bytes: [UInt8](repeating: 7, count: Sodium.keyLength))!)

/// One input, as libFuzzer hands it over.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let text = String(decoding: UnsafeBufferPointer(start: start, count: count), as: UTF8.self)
    guard let configuration = try? ConfigFile.parse(text, path: "fuzz.toml") else { return 0 }
    for spec in configuration.accounts.values { _ = try? ProviderConfig.checking(spec) }
    let http = IdPClient(settings: configuration.settings)
    _ = try? Broker(vault: vault, settings: configuration.settings, http: http, logger: logger)
    let closed = DispatchSemaphore(value: 0)
    Task {
        await http.shutdown()
        closed.signal()
    }
    closed.wait()
    return 0
}

runFuzzer(fuzzOne)
