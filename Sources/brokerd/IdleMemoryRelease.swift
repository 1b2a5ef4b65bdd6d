import CIdleMemory
import Logging
import ServiceLifecycle

/// Keeps an idle brokerd small, as a `Service`: a second after the service group starts (the
/// vault is loaded by then), and every ten minutes after that, it unmaps the code and read-only
/// data it has not run since and trims the heap (`tokenbroker_release_idle_memory`). Start-up
/// code (the vault reader, argument parsing, the service group's set-up) then stops counting
/// against brokerd's resident memory, and so does a refresh's HTTP code between refreshes; a
/// page that runs again is mapped again from the page cache.
struct IdleMemoryRelease: Service {
    let logger: Logger
    private static let first = Duration.seconds(1)
    private static let every = Duration.seconds(600)

    func run() async throws {
        var wait = Self.first
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let period = wait
            guard (try? await cancelWhenGracefulShutdown({ try await Task.sleep(for: period) })) != nil else { return }
            let released = tokenbroker_release_idle_memory()
            logger.debug("released idle memory", metadata: ["segment_bytes": "\(released)"])
            wait = Self.every
        }
    }
}
