#if canImport(Glibc)
import Glibc
#endif

/// A detached POSIX thread: the blocking client and brokerctl start no task runtime, and a
/// thread blocked in a read (a connection's reader, a subscription) must not hold up the
/// caller's waits.
public enum OwnThread {
    /// Holds the body across `pthread_create`.
    private final class Body {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }

    /// Runs `body` on a new thread, which inherits the caller's signal mask; returns 0, or the
    /// error number when no thread could be started.
    public static func start(_ body: @escaping @Sendable () -> Void) -> Int32 {
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
            return result
        }
        pthread_detach(thread)
        return 0
    }
}
