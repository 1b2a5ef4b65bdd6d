@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import FuzzSupport
import Glibc
import Logging

/// The vault loader, then what a starting broker does with what it loaded (schedule every
/// account, serve its token). The first byte picks the input's form: odd, the decrypted JSON of
/// a snapshot, sealed here under the fixed key so that the decoder of `AccountRecord` and
/// everything after it is reached; 2 modulo 4, the records of a log (lengths, sequence numbers,
/// nonces, ciphertexts, a torn end) after a valid header, beside an empty snapshot; otherwise a
/// whole snapshot file as it lies on disk (header, nonce, ciphertext).
let key = SecretKey(bytes: [UInt8](repeating: 7, count: Sodium.keyLength))!
let path = scratchDirectory("vault") + "/vault"
let vault = try! Vault(path: path, key: key)
let http = IdPClient(settings: BrokerSettings())
let logger = Logger(label: "fuzz") { _ in SwiftLogNoOpLogHandler() }

/// One input, as libFuzzer hands it over.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let form = input.byte() % 4
    let body = input.rest()
    unlink(vault.logPath)
    switch form {
    case 0:
        write(Data(body), to: path)
    case 1, 3:
        var header = VaultSnapshot.magic
        // 1 reaches the conversion of a format 1 vault, 3 a snapshot of today's format.
        header.append(bigEndian: form == 1 ? VaultSnapshot.singleFileVersion : VaultSnapshot.formatVersion)
        let nonce = [UInt8](repeating: 1, count: Sodium.nonceLength)
        header += nonce
        var file = Data(header)
        file.append(Sodium.seal(Data(body), associatedData: header, nonce: nonce, key: key))
        write(file, to: path)
    default:
        guard (try? vault.save(VaultContents(accounts: []))) != nil,
            let file = try? Data(contentsOf: URL(fileURLWithPath: path)),
            let snapshot = try? VaultSnapshot.open([UInt8](file), path: path, key: key)
        else { fatalError("cannot write \(path)") }
        let header = VaultLog.header(generation: snapshot.generation, snapshotNonce: snapshot.nonce, key: key).bytes
        write(Data(header + body), to: vault.logPath)
    }
    guard let contents = try? vault.load(),
        let broker = try? Broker(vault: vault, settings: BrokerSettings(), http: http, logger: logger)
    else { return 0 }
    let now = Date()
    for record in contents.accounts {
        _ = broker.cache.token(for: record.name, minTTL: 0, now: now)?.line(id: .integer(1), now: now)
    }
    return 0
}

/// Writes `data` to `file` as the vault's own (private) file.
func write(_ data: Data, to file: String) {
    guard (try? data.write(to: URL(fileURLWithPath: file))) != nil else { fatalError("cannot write \(file)") }
    chmod(file, 0o600)
}

runFuzzer(fuzzOne)
