import ArgumentParser
import BrokerClient
import BrokerProtocol
// `sigset_t` comes with <spawn.h>, which CSpawn's module holds since brokerctl links it (exec).
import CSpawn

#if canImport(Glibc)
import Glibc
#endif

struct Unlock: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "unlock",
        abstract: "Unlock a broker in passphrase mode (the first unlock sets the passphrase).",
        discussion: """
            The passphrase is read from the terminal without echo (asked twice when it is being set),
            or as one line from standard input when that is not a terminal; never from the command line
            or the environment. A wrong passphrase is refused after a delay that grows with each wrong
            one in a row (exit code 7).
            """)

    @OptionGroup var options: GlobalOptions

    func run() throws {
        let client = try options.client()
        let status = try options.reportingFailures { try client.perform(.status()) }
        guard status.locked == true else {
            print("the broker is unlocked")
            return
        }
        let isNew = status.newVault == true
        let passphrase = try PassphrasePrompt.read(
            prompt: isNew ? "New vault passphrase: " : "Vault passphrase: ", confirm: isNew)
        try options.run(.unlock(passphrase: passphrase)) { result in
            result.created == true
                ? "passphrase set; unlocked (new vault)"
                : "unlocked (\(result.accounts.map(String.init) ?? "all") accounts)"
        }
    }
}

struct Lock: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lock",
        abstract: "Make a broker in passphrase mode forget its vault key and every decrypted secret.",
        discussion: "Nothing is served until brokerctl unlock; status still lists the accounts, as locked.")

    @OptionGroup var options: GlobalOptions

    func run() throws {
        try options.run(.lock()) { _ in "locked" }
    }
}

struct Rekey: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rekey",
        abstract: "Re-encrypt the vault under a new passphrase, or under the key file.",
        discussion: """
            --to passphrase (the default) reads the new passphrase as unlock does, asked twice on a
            terminal, and removes the key file once the vault no longer needs it. --to keyfile writes
            (or reuses) the key file, then re-encrypts the vault under it. A crash at any instant leaves
            a vault that the old or the new key opens. The broker must be unlocked.
            """)

    @OptionGroup var options: GlobalOptions
    @Option(help: "The key to move to: passphrase or keyfile.") var to = "passphrase"

    func validate() throws {
        guard to == "passphrase" || to == "keyfile" else { throw ValidationError("--to must be passphrase or keyfile") }
    }

    func run() throws {
        let passphrase =
            to == "passphrase" ? try PassphrasePrompt.read(prompt: "New vault passphrase: ", confirm: true) : nil
        try options.run(.rekey(passphrase: passphrase)) { result in
            var lines =
                result.key == "passphrase"
                ? [
                    "vault re-encrypted under the new passphrase; brokerd starts locked from now on",
                    "(set key = \"passphrase\" under [broker] in broker.toml so that it insists on one)",
                ]
                : [
                    "vault re-encrypted under the key file",
                    "(remove key = \"passphrase\" from broker.toml, or --passphrase, before brokerd restarts)",
                ]
            if let left = result.keyFileLeft {
                lines.append("the key file \(left) could not be removed (a systemd credential?); remove it yourself")
            }
            return lines.joined(separator: "\n")
        }
    }
}

/// Reads a passphrase: from the terminal without echo, or one line of standard input when that
/// is not a terminal. Never from the command line or the environment, which other processes
/// of the user can read.
enum PassphrasePrompt {
    /// Reads one passphrase, prompting on standard error; when `confirm` and on a terminal, asks
    /// for it twice and refuses two that differ.
    static func read(prompt: String, confirm: Bool) throws -> String {
        guard isatty(STDIN_FILENO) == 1 else {
            return try line(name: "standard input")
        }
        let first = try TerminalEcho.withEchoOff { () throws -> String in
            StandardStream.error.write(prompt)
            defer { StandardStream.error.write("\n") }
            return try line(name: "the terminal")
        }
        guard confirm else { return first }
        let second = try TerminalEcho.withEchoOff { () throws -> String in
            StandardStream.error.write("Repeat it: ")
            defer { StandardStream.error.write("\n") }
            return try line(name: "the terminal")
        }
        guard first == second else { throw ValidationError("the two passphrases differ; nothing was changed") }
        return first
    }

    /// One line of standard input, without its line end: 1 to `maximumPassphraseLength` bytes of UTF-8.
    /// The bytes read are zeroed once the text is made (room for them all is reserved first, so
    /// no copy is left behind by a growing buffer).
    private static func line(name: String) throws -> String {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(maximumPassphraseLength + 1)
        var byte: UInt8 = 0
        defer { bytes.withUnsafeMutableBytes { if let base = $0.baseAddress { explicit_bzero(base, $0.count) } } }
        while true {
            let count = Glibc.read(STDIN_FILENO, &byte, 1)
            if count < 0, errno == EINTR { continue }
            guard count >= 0 else { throw ValidationError("cannot read the passphrase from \(name)") }
            if count == 0 || byte == UInt8(ascii: "\n") { break }
            bytes.append(byte)
            guard bytes.count <= maximumPassphraseLength else {
                throw ValidationError("a passphrase is at most \(maximumPassphraseLength) bytes")
            }
        }
        if bytes.last == UInt8(ascii: "\r") { bytes.removeLast() }
        guard !bytes.isEmpty else { throw ValidationError("no passphrase was given on \(name)") }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw ValidationError("the passphrase is not UTF-8 text")
        }
        return text
    }
}

/// Turns the terminal's echo off around a read, and back on on every way out: a return, a
/// throw, and the signals a person sends from the keyboard (Ctrl-C, Ctrl-\, Ctrl-Z) or a hang-up.
enum TerminalEcho {
    /// The terminal's settings before the read, for the signal handlers (set before they are
    /// installed, read only by them and by `withEchoOff` on the same thread).
    nonisolated(unsafe) private static var saved = termios()
    /// The settings with echo off, to restore after a stop (Ctrl-Z) and a `fg`.
    nonisolated(unsafe) private static var silent = termios()

    /// The signals that end the process (their default action), after which echo is restored.
    private static let ending = [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
    /// The signals that stop it: echo is restored while it is stopped, and turned off again after.
    private static let stopping = [SIGTSTP, SIGTTIN, SIGTTOU]

    static func withEchoOff<T>(_ body: () throws -> T) throws -> T {
        var original = termios()
        guard tcgetattr(STDIN_FILENO, &original) == 0 else {
            throw ValidationError("cannot read the terminal's settings")
        }
        saved = original
        silent = original
        silent.c_lflag &= ~tcflag_t(ECHO)
        let previous = (ending + stopping).map { signal($0) { TerminalEcho.handle($0) } }
        defer {
            tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved)
            for (number, handler) in zip(ending + stopping, previous) { signal(number, handler) }
        }
        guard tcsetattr(STDIN_FILENO, TCSAFLUSH, &silent) == 0 else {
            throw ValidationError("cannot turn the terminal's echo off")
        }
        return try body()
    }

    /// Restores echo, then lets the signal do what it does by default; after a stop, turns echo
    /// off again. Calls only async-signal-safe functions.
    private static func handle(_ number: Int32) {
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved)
        let previous = signal(number, SIG_DFL)
        var unblocked = sigset_t()
        sigemptyset(&unblocked)
        sigaddset(&unblocked, number)
        sigprocmask(SIG_UNBLOCK, &unblocked, nil)
        raise(number)
        // Only a stopping signal comes back here, once the process is continued.
        signal(number, previous)
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &silent)
    }
}
