import ArgumentParser
import BrokerProtocol
import FoundationEssentials

/// Where the broker is and how to print: options every subcommand takes.
struct ConnectionOptions: ParsableArguments {
    @Option(help: "Socket path (default: $TOKENBROKER_SOCKET or $XDG_RUNTIME_DIR/tokenbroker/broker.sock).")
    var socket: String?

    @Flag(help: "Print the result as JSON.")
    var json = false
}
