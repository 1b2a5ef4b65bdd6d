import CSystemd

#if canImport(Glibc)
import Glibc
#endif

/// Process-wide protections applied before any secret is loaded.
public enum ProcessHardening {
    /// Makes the process non-dumpable (no core files, no ptrace by the same uid) and raises
    /// the open-file limit to its hard maximum so many clients can stay connected.
    public static func apply() {
        _ = tokenbroker_set_non_dumpable()
        var limit = rlimit()
        let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        if getrlimit(resource, &limit) == 0, limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            _ = setrlimit(resource, &limit)
        }
    }
}
