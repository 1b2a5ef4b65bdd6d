import CGlobalExecutorHook
import FoundationEssentials
import NIOCore
import NIOPosix

/// How many event-loop threads serve the socket and the IdP connections (NIO's process-wide
/// singleton group): `TOKENBROKER_EVENT_LOOPS`, a whole number from 1 to 64, else `standard`.
enum EventLoops {
    static let variable = "TOKENBROKER_EVENT_LOOPS"
    static let allowed = 1...64
    /// One loop: on 2 cores (`bench/run`), one loop served cached tokens at 64 connections with
    /// a lower p99 than two whenever other work left the machine's cores to the benchmark, for
    /// up to a third fewer requests per second, which a per-user broker does not need; at one
    /// connection the two were alike.
    static let standard = 1

    /// The count `environment` asks for; throws if the variable is set to anything but a whole
    /// number in `allowed`.
    static func count(environment: [String: String]) throws -> Int {
        guard let text = environment[variable] else { return standard }
        guard text.utf8.count <= 2, let count = Int(text), allowed.contains(count) else {
            throw EventLoopsError(
                description: "\(variable) must be a whole number from \(allowed.lowerBound) to \(allowed.upperBound)")
        }
        return count
    }

    /// Sizes NIO's singleton group to `count` loops and makes it run every Swift concurrency
    /// task, so that libdispatch's worker threads never start: the first of them would arm
    /// libdispatch's workqueue monitor, which wakes the process once a second for good
    /// (docs/performance.md). Must run once, before any task exists. Returns whether the
    /// tasks now run on the group (false: another hook was set, and libdispatch runs them).
    ///
    /// This is what `NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor`
    /// does, which finds the hook with `dlsym` and so not in brokerd, whose static Swift runtime
    /// exports no symbols. As there, the runtime's hook type is taken to be this thin function's.
    static func takeOver(count: Int) -> Bool {
        NIOSingletons.groupLoopCountSuggestion = count
        typealias Original = @convention(thin) (UnownedJob) -> Void
        typealias Hook = @convention(thin) (UnownedJob, Original) -> Void
        let hook: Hook = { job, _ in MultiThreadedEventLoopGroup.singleton.any().enqueue(ExecutorJob(job)) }
        return withUnsafeTemporaryAllocation(of: Hook.self, capacity: 1) { slot in
            slot.baseAddress!.initialize(to: hook)
            return slot.baseAddress!.withMemoryRebound(to: UnsafeRawPointer.self, capacity: 1) {
                tokenbroker_install_enqueue_global_hook($0.pointee) == 1
            }
        }
    }
}

/// `TOKENBROKER_EVENT_LOOPS` holds something brokerd cannot use (its value is not repeated).
struct EventLoopsError: Error, CustomStringConvertible {
    let description: String
}
