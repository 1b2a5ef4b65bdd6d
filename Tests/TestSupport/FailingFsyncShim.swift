import Foundation

/// An `LD_PRELOAD` library, compiled by the test with the system's `cc`, that makes `fsync` and
/// `fdatasync` fail with `EIO` while a flag file exists: a disk whose writeback fails, for a
/// brokerd started with `environment`. Each failure it makes adds a byte to a file, so a test
/// can wait for brokerd's next try instead of guessing when it comes.
public struct FailingFsyncShim: Sendable {
    public let library: String
    public let flag: String
    private let failureCount: String

    static let source = """
        #define _GNU_SOURCE
        #include <dlfcn.h>
        #include <errno.h>
        #include <fcntl.h>
        #include <stdlib.h>
        #include <unistd.h>

        static int failing(void) {
            const char *flag = getenv("TB_FAILING_FSYNC_FLAG");
            if (flag == NULL || access(flag, F_OK) != 0) return 0;
            const char *count = getenv("TB_FAILING_FSYNC_COUNT");
            int fd = count == NULL ? -1 : open(count, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
            if (fd >= 0) { (void)write(fd, "x", 1); close(fd); }
            return 1;
        }

        int fsync(int fd) {
            if (failing()) { errno = EIO; return -1; }
            int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
            return real(fd);
        }

        int fdatasync(int fd) {
            if (failing()) { errno = EIO; return -1; }
            int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
            return real(fd);
        }
        """

    /// Compiles the library into `directory`; the flag file is `directory/fsync-fails`.
    public init(in directory: TemporaryDirectory) throws {
        let source = directory.file("failing-fsync.c")
        library = directory.file("failing-fsync.so")
        flag = directory.file("fsync-fails")
        failureCount = directory.file("fsync-failures")
        try Self.source.write(toFile: source, atomically: true, encoding: .utf8)
        let built = try ChildProcess.run(
            "/usr/bin/cc", ["-shared", "-fPIC", "-o", library, source, "-ldl"],
            environment: ProcessInfo.processInfo.environment)
        guard built.status == 0 else { throw HarnessError("cannot build the fsync shim: \(built.output)") }
    }

    /// What brokerd's environment needs for the library to take effect.
    public var environment: [String: String] {
        ["LD_PRELOAD": library, "TB_FAILING_FSYNC_FLAG": flag, "TB_FAILING_FSYNC_COUNT": failureCount]
    }

    /// How many `fsync` and `fdatasync` calls it has failed so far.
    public var failures: Int {
        FileManager.default.contents(atPath: failureCount)?.count ?? 0
    }

    /// Makes `fsync` and `fdatasync` fail (`true`) or work again.
    public func fail(_ failing: Bool) throws {
        if failing {
            try Data().write(to: URL(fileURLWithPath: flag))
        } else {
            try? FileManager.default.removeItem(atPath: flag)
        }
    }
}
