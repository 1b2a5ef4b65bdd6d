import ArgumentParser

/// Every exit code brokerctl ends with and what it means: the one list `--help` shows and
/// docs/commands.md and brokerctl(1) must match (ExitStatusTests compares them), so a script
/// can branch on a code and trust it.
enum ExitStatus: Int32, CaseIterable {
    case ok = 0
    case failure = 1
    case brokerNotRunning = 3
    case notFound = 4
    case needsLogin = 5
    case unavailable = 6
    case forbidden = 7
    case locked = 8
    /// Next in the series of the broker's refusals (3-8): a permanent one, unlike 6.
    case lifetimeTooShort = 9
    /// sysexits' EX_USAGE, which ArgumentParser exits with.
    case usage = 64
    /// sysexits' EX_DATAERR.
    case dataError = 65
    /// sysexits' EX_NOINPUT.
    case noInput = 66
    /// sysexits' EX_TEMPFAIL ("try again later"): the broker is up and may be waiting for a slow
    /// IdP, so a retry or a longer `--timeout` can succeed, unlike 3; and mail and job runners
    /// already retry on 75.
    case brokerTimedOut = 75
    /// The shell's code for a command found but not runnable.
    case cannotRun = 126
    /// The shell's code for a command not found.
    case commandNotFound = 127

    /// What the code tells a script, as `--help`, docs/commands.md and brokerctl(1) say it.
    var meaning: String {
        switch self {
        case .ok: "ok"
        case .failure: "other error"
        case .brokerNotRunning: "the broker is not running (or the connection to it broke)"
        case .notFound: "not found: no such account, or no id token"
        case .needsLogin: "needs login: the account has no token it can serve; also add of such an account"
        case .unavailable: "unavailable: the IdP is failing or the broker is busy; try later"
        case .forbidden: "forbidden"
        case .locked: "locked: run brokerctl unlock"
        case .lifetimeTooShort:
            "the IdP grants tokens shorter than --min-ttl, so no later try helps; ask for less or add --best-effort"
        case .usage: "usage error: an unknown command or option, or a bad value"
        case .dataError: "data error: the JSON read by --secrets or --from is malformed"
        case .noInput: "no input: the file given to --secrets or --from does not exist or cannot be read"
        case .brokerTimedOut: "timeout: the broker did not answer within --timeout; try again or wait longer"
        case .cannotRun: "exec: CMD cannot be run"
        case .commandNotFound: "exec: CMD was not found"
        }
    }

    /// Codes that are not brokerctl's own but passed on, and what each means.
    static let passedOn: [(code: String, meaning: String)] = [
        ("128+N", "login, exec: ended by signal N (130 after Ctrl-C)"),
        ("CMD's", "exec: the exit code of CMD once it ran"),
    ]

    /// Every row of the exit code table: code and meaning.
    static var table: [(code: String, meaning: String)] {
        allCases.map { (code: String($0.rawValue), meaning: $0.meaning) } + passedOn
    }
}

extension ExitCode {
    init(_ status: ExitStatus) { self.init(status.rawValue) }
}
