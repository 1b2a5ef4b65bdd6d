import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// Options every subcommand but `login` takes (its `--timeout` is the time the user has to sign in).
struct GlobalOptions: ParsableArguments {
    @OptionGroup var connection: ConnectionOptions

    @Option(help: "Seconds to wait for the broker's answer (it may be refreshing at the IdP).")
    var timeout: Double = 120

    var socket: String? { connection.socket }
    var json: Bool { connection.json }

    /// Sends `call`, prints its result, and turns failures into a message on stderr and a
    /// distinct exit code; returns the result.
    @discardableResult
    func run<Result: Encodable>(_ call: BrokerCall<Result>, human: (Result) -> String) throws -> Result {
        let result = try Self.reportingFailures(account: call.request.account, socket: socket) {
            try client().perform(call)
        }
        try show(result, human: human)
        return result
    }

    /// Prints `result`: as JSON with `--json`, else as `human` says (nothing when it says "").
    func show<Result: Encodable>(_ result: Result, human: (Result) -> String) throws {
        if json {
            let data = try Wire.makeEncoder().encode(result)
            print(String(decoding: data, as: UTF8.self))
        } else {
            let text = human(result)
            if !text.isEmpty { print(text) }
        }
    }

    /// A client of the broker at `--socket` with the `--timeout` of these options.
    func client() throws -> BlockingBrokerClient {
        try Self.client(socket: socket, timeout: timeout)
    }

    /// A client of the broker at `socket` (the default path when `nil`) that waits `timeout` seconds.
    static func client(socket: String?, timeout: Double) throws -> BlockingBrokerClient {
        guard timeout.isFinite, timeout > 0, timeout <= Bounds.maximumLifetime else {
            throw ValidationError("--timeout must be a number of seconds above 0")
        }
        return BlockingBrokerClient(
            socketPath: socket ?? DefaultPaths().socket, timeout: .milliseconds(Bounds.milliseconds(timeout)))
    }

    /// Runs `body`; a failure becomes a message on stderr and the exit code that says what failed.
    func reportingFailures<T>(_ body: () throws -> T) throws -> T { try Self.reportingFailures(body) }

    /// Runs `body`; a failure becomes a message on stderr and the exit code that says what failed.
    /// An `account` the broker does not know gets the nearest name among those `status` at
    /// `socket` shows this caller (only accounts it may use), when one is close.
    static func reportingFailures<T>(account: String? = nil, socket: String? = nil, _ body: () throws -> T) throws
        -> T
    {
        do {
            return try body()
        } catch let error as ConnectionError where error.timedOut {
            StandardStream.error.write("brokerctl: \(error); try again, or wait longer with --timeout\n")
            throw ExitCode(.brokerTimedOut)
        } catch let error as ConnectionError {
            StandardStream.error.write("brokerctl: \(error)\n")
            throw ExitCode(.brokerNotRunning)
        } catch let error as BrokerError {
            let suggestion = error.code == .notFound ? account.flatMap { nearestAccount(to: $0, socket: socket) } : nil
            StandardStream.error.write(
                "brokerctl: \(error.message)\(Self.hint(error))"
                    + (suggestion.map { "; did you mean \(JSONText.quote($0))?" } ?? "") + "\n")
            throw ExitCode(Self.exitStatus(error.code))
        }
    }

    /// The account name nearest to `name` among those the broker shows this caller, if close.
    private static func nearestAccount(to name: String, socket: String?) -> String? {
        Suggestion.nearest(to: name, among: AccountNames.visible(socket: socket, timeout: 2))
    }

    static func exitStatus(_ code: BrokerError.Code) -> ExitStatus {
        switch code {
        case .notFound: .notFound
        case .needsLogin: .needsLogin
        case .unavailable, .busy: .unavailable
        case .forbidden: .forbidden
        case .locked: .locked
        case .lifetimeTooShort: .lifetimeTooShort
        default: .failure
        }
    }

    private static func hint(_ error: BrokerError) -> String {
        guard let wait = error.retryAfterMs else { return "" }
        return " (retry in \(max(1, wait / 1000)) s)"
    }
}
