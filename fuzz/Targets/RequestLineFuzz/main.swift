import BrokerProtocol
import FoundationEssentials
import FuzzSupport

/// The request line: whenever the fast path (`FlatRequest`) reads a line, the full path
/// (`JSONLine`, then the decoder over `Request`) must accept it and read the same id, op,
/// account and min_ttl. Traps on the first line the two paths read differently.
let decoder = Wire.makeDecoder()

/// One input, as libFuzzer hands it over.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let line = UnsafeRawBufferPointer(start: start, count: count)
    let problem = JSONLine.problem(in: line)
    guard let flat = FlatRequest.parse(line) else { return 0 }
    guard problem == nil, let full = try? decoder.decode(Request.self, from: Data(line)) else {
        fatalError("the fast path read \(flat), the full path refused the line (\(String(describing: problem)))")
    }
    guard flat == FlatRequest(full) else {
        fatalError("the fast path read \(flat), the full path \(FlatRequest(full))")
    }
    return 0
}

runFuzzer(fuzzOne)
