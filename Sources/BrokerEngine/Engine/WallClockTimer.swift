import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import CTimerFD
import FoundationEssentials
import NIOPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A one-shot timer on the wall clock, the clock every expiry and refresh time is judged by: a
/// `timerfd` on CLOCK_REALTIME, set for an absolute time with TFD_TIMER_CANCEL_ON_SET. It calls
/// `fired` when the wall clock reaches that time, and also whenever the wall clock is set (a
/// jump, NTP stepping it, a resume from suspend), so the caller looks at the time again then,
/// without polling for it. One thread of its own waits in read(2) and wakes only for those.
package final class WallClockTimer: Sendable {
    /// How far ahead the timer is set when there is nothing to wait for: it must stay set to
    /// report a change of the wall clock, and then fires at least once a day.
    package static let farAhead: TimeInterval = 86_400

    private let descriptor: Int32
    private let thread = NIOThreadPool(numberOfThreads: 1)
    private let closing = Atomic<Bool>(false)

    package init(fired: @escaping @Sendable () -> Void) throws {
        descriptor = timerfd_create(CLOCK_REALTIME, Int32(TFD_CLOEXEC))
        guard descriptor >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        set(to: nil)
        thread.start()
        // Holds the timer until `close` ends the loop.
        thread.submit { [self] _ in
            var expirations: UInt64 = 0
            while !closing.load(ordering: .acquiring) {
                let count = read(descriptor, &expirations, MemoryLayout<UInt64>.size)
                guard count == MemoryLayout<UInt64>.size || errno == ECANCELED else {
                    precondition(errno == EINTR, "timerfd read failed: errno \(errno)")
                    continue
                }
                if !closing.load(ordering: .acquiring) { fired() }
            }
        }
    }

    /// Fires at `date` (at once if it has passed), or only at a change of the wall clock when
    /// `date` is nil; replaces the time set before.
    package func set(to date: Date?) {
        let farAhead = Date(timeIntervalSinceNow: Self.farAhead).timeIntervalSince1970
        // A deadline derives from a vault's or an IdP's dates: one past the far-ahead point (or no
        // number at all) waits for that point, one before 1970 fires at once; never a trap below.
        let wanted = date?.timeIntervalSince1970 ?? farAhead
        let seconds = wanted.isNaN ? farAhead : min(max(wanted, 0), farAhead)
        // Rounded up to the microsecond, so the broker's clock has reached `date` when it fires.
        let microseconds = max(1, Int64((seconds * 1_000_000).rounded(.up)))
        var setting = itimerspec()
        setting.it_value.tv_sec = Int(microseconds / 1_000_000)
        setting.it_value.tv_nsec = Int(microseconds % 1_000_000) * 1000
        let result = timerfd_settime(descriptor, Int32(TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET), &setting, nil)
        precondition(result == 0, "timerfd_settime failed: errno \(errno)")
    }

    /// Stops the thread (the timer fires at once to wake it) and closes the timer.
    package func close() async {
        closing.store(true, ordering: .releasing)
        set(to: .distantPast)
        try? await thread.shutdownGracefully()
        _ = Glibc.close(descriptor)
    }
}
