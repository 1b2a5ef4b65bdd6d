import CSystemd

#if canImport(Glibc)
import Glibc
#endif

/// Process-wide protections applied before any secret is loaded.
public enum ProcessHardening {
    /// Keeps secrets out of crash output and away from other processes: no core file ever
    /// (`RLIMIT_CORE` 0, hard limit too, so neither brokerd nor its helpers can raise it),
    /// non-dumpable (no ptrace or /proc memory access by the same uid). Raises the open-file
    /// limit to its hard maximum so many clients can stay connected.
    public static func apply() {
        _ = tokenbroker_set_non_dumpable()
        var noCore = rlimit(rlim_cur: 0, rlim_max: 0)
        _ = setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &noCore)
        var limit = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        if getrlimit(resource, &limit) == 0, limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(resource, &limit)
        }
    }
}
