#if canImport(Glibc)
import Glibc
#endif

/// A detached POSIX thread: brokerctl starts no task runtime, and a thread blocked in a read
/// (a subscription) must not hold up the main thread's waits.
enum OwnThread {
    /// Holds the body across `pthread_create`.
    private final class Body {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }

    /// Runs `body` on a new thread, which inherits the caller's signal mask.
    static func start(_ body: @escaping @Sendable () -> Void) throws {
        let context = Unmanaged.passRetained(Body(body)).toOpaque()
        var thread = pthread_t()
        let result = pthread_create(
            &thread, nil,
            { context in
                Unmanaged<Body>.fromOpaque(context!).takeRetainedValue().run()
                return nil
            }, context)
        guard result == 0 else {
            Unmanaged<Body>.fromOpaque(context).release()
            throw BridgeFailure("cannot start a thread: \(String(cString: strerror(result)))")
        }
        pthread_detach(thread)
    }
}
