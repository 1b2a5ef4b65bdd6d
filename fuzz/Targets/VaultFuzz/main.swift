@testable import BrokerCore
import BrokerProtocol
import FoundationEssentials
import FuzzSupport
import Logging

/// The vault loader, then what a starting broker does with what it loaded (schedule every
/// account, serve its token). The first byte picks the input's form: a whole vault file as
/// it lies on disk (header, nonce, ciphertext), or the decrypted JSON, which is sealed here
/// under the fixed key so that the decoder of `AccountRecord` and everything after it is reached.
let key = SecretKey(bytes: [UInt8](repeating: 7, count: Sodium.keyLength))!
let path = scratchDirectory("vault") + "/vault"
let vault = try! Vault(path: path, key: key)
let http = IdPClient(settings: BrokerSettings())
let logger = Logger(label: "fuzz") { _ in SwiftLogNoOpLogHandler() }

/// One input, as libFuzzer hands it over.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let sealed = input.byte() % 2 == 1
    let body = input.rest()
    var file: Data
    if sealed {
        var header = Vault.magic + [UInt8(Vault.formatVersion >> 8), UInt8(Vault.formatVersion & 0xFF)]
        let nonce = [UInt8](repeating: 1, count: Sodium.nonceLength)
        header += nonce
        file = Data(header)
        file.append(Sodium.seal(Data(body), associatedData: header, nonce: nonce, key: key))
    } else {
        file = Data(body)
    }
    guard (try? file.write(to: URL(fileURLWithPath: path))) != nil else { fatalError("cannot write \(path)") }
    guard let contents = try? vault.load(),
        let broker = try? Broker(vault: vault, settings: BrokerSettings(), http: http, logger: logger)
    else { return 0 }
    let now = Date()
    for record in contents.accounts {
        _ = broker.cache.token(for: record.name, minTTL: 0, now: now)?.line(id: .integer(1), now: now)
    }
    return 0
}

runFuzzer(fuzzOne)
