import Glibc

/// One fuzz input as raw bytes.
public typealias FuzzCallback = @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt

@_silgen_name("LLVMFuzzerRunDriver")
private func llvmFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ callback: FuzzCallback
) -> CInt

/// Runs libFuzzer's driver (it reads the usual libFuzzer flags from the command line) on
/// `callback` and exits with its status.
///
/// A fuzz target starts libFuzzer from its own `main` because SwiftPM links every executable
/// with its own entry point, so libFuzzer's `main` is never used. The target still names its
/// callback `LLVMFuzzerTestOneInput` (`@_cdecl`), which libFuzzer's unused `main` refers to.
public func runFuzzer(_ callback: FuzzCallback) -> Never {
    var argc = CommandLine.argc
    var argv = CommandLine.unsafeArgv
    exit(llvmFuzzerRunDriver(&argc, &argv, callback))
}
