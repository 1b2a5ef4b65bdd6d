import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `brokerctl unlock` on a terminal (a pseudo-terminal the test holds the other end of): the
/// passphrase is typed without echo, asked twice when it is being set, and the terminal gets
/// its echo back when brokerctl ends, by an answer or by Ctrl-C's SIGINT.
@Suite struct PassphrasePromptTests {
    /// A pseudo-terminal: the test types on `controller`, brokerctl reads `terminal`.
    final class PseudoTerminal: @unchecked Sendable {
        let controller: Int32
        let terminal: Int32

        /// Linux's `TIOCSPTLCK` and `TIOCGPTN` (macros Swift does not import).
        static let unlockRequest: UInt = 0x4004_5431
        static let numberRequest: UInt = 0x8004_5430

        init() throws {
            controller = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC)
            var unlocked: Int32 = 0
            var number: Int32 = 0
            guard controller >= 0, ioctl(controller, Self.unlockRequest, &unlocked) == 0,
                ioctl(controller, Self.numberRequest, &number) == 0
            else { throw HarnessError("no pseudo-terminal") }
            terminal = open("/dev/pts/\(number)", O_RDWR | O_NOCTTY | O_CLOEXEC)
            guard terminal >= 0 else { throw HarnessError("cannot open /dev/pts/\(number)") }
        }

        deinit {
            close(terminal)
            close(controller)
        }

        /// Whether the terminal echoes what is typed.
        var echoes: Bool {
            var settings = termios()
            tcgetattr(terminal, &settings)
            return settings.c_lflag & tcflag_t(ECHO) != 0
        }

        func type(_ text: String) {
            _ = Array(text.utf8).withUnsafeBytes { write(controller, $0.baseAddress, $0.count) }
        }

        /// What the terminal showed until it shows `text` (at most `seconds` later).
        func read(until text: String, seconds: Double = 30) -> String {
            var shown = ""
            let deadline = Date().addingTimeInterval(seconds)
            while !shown.contains(text), Date() < deadline {
                var poller = pollfd(fd: controller, events: Int16(POLLIN), revents: 0)
                guard poll(&poller, 1, 100) > 0 else { continue }
                var buffer = [UInt8](repeating: 0, count: 4096)
                let count = Glibc.read(controller, &buffer, buffer.count)
                guard count > 0 else { break }
                shown += String(decoding: buffer[..<count], as: UTF8.self)
            }
            return shown
        }
    }

    /// Starts `brokerctl unlock` against `broker` on `pty`.
    func unlock(_ broker: BrokerProcess, on pty: PseudoTerminal) throws -> ChildProcess {
        try ChildProcess.spawn(
            BrokerProcess.binary("brokerctl").path, ["unlock"],
            environment: broker.environment.merging(["TOKENBROKER_SOCKET": broker.socketPath]) { $1 },
            input: pty.terminal, output: pty.terminal)
    }

    @Test func theTerminalDoesNotEchoThePassphraseAndGetsItsEchoBackEvenAfterCtrlC() async throws {
        let broker = try BrokerProcess()
        try await broker.start(arguments: ["--passphrase"])
        defer { broker.stop() }
        let pty = try PseudoTerminal()
        #expect(pty.echoes)

        let setting = try unlock(broker, on: pty)
        var shown = try await onOwnThread { pty.read(until: "New vault passphrase: ") }
        #expect(!pty.echoes, "echo is off while the passphrase is typed")
        pty.type("typed secret\n")
        shown += try await onOwnThread { pty.read(until: "Repeat it: ") }
        pty.type("typed secret\n")
        #expect(try await onOwnThread { setting.wait() } == 0)
        shown += try await onOwnThread { pty.read(until: "unlocked") }
        #expect(shown.contains("passphrase set"))
        let echoed = shown.contains("typed secret")
        #expect(!echoed, "the passphrase was echoed")
        #expect(pty.echoes, "echo is back")

        #expect(try await broker.brokerctl(["lock"]).status == 0)
        let interrupted = try unlock(broker, on: pty)
        _ = try await onOwnThread { pty.read(until: "Vault passphrase: ") }
        #expect(!pty.echoes)
        kill(interrupted.pid, SIGINT)
        #expect(try await onOwnThread { interrupted.wait() } == 128 + SIGINT, "Ctrl-C ends brokerctl as SIGINT does")
        #expect(pty.echoes, "echo is back after Ctrl-C")
        #expect(try await broker.brokerctl(["status", "--json"]).stdout.contains("\"locked\":true"))

        let reopening = try unlock(broker, on: pty)
        _ = try await onOwnThread { pty.read(until: "Vault passphrase: ") }
        pty.type("typed secret\n")
        #expect(try await onOwnThread { reopening.wait() } == 0, "an existing vault's passphrase is asked once")
        #expect(pty.echoes)
    }
}
