import FoundationEssentials

/// `broker-bench table`: reads the figures of one run on standard input (`key=value` words, or
/// JSON objects of numbers such as the last line of cli-vs-oidc-token.sh) and prints the table
/// of docs/performance.md: each figure, its yardstick measured in the same run, their ratio, the target and
/// whether it is met; then every other figure of the run.
enum Table {
    /// How a figure is shown: its unit, and the factor from the unit of its key.
    enum Unit {
        case milliseconds, microseconds, millisecondsFromMicroseconds, mebibytes, requestsPerSecond, wakeUps
        /// A number of events, and a mean number per event (IdP calls per rotation).
        case count, mean

        func show(_ value: Double) -> String {
            switch self {
            case .milliseconds: Table.decimal(value, places: 2) + " ms"
            case .microseconds: Table.decimal(value, places: 1) + " µs"
            case .millisecondsFromMicroseconds: Table.decimal(value / 1000, places: 2) + " ms"
            case .mebibytes: Table.decimal(value, places: 1) + " MiB"
            case .requestsPerSecond: Table.decimal(value / 1000, places: 1) + "k req/s"
            case .wakeUps, .count: Table.decimal(value, places: 0)
            case .mean: Table.decimal(value, places: 2)
            }
        }

        /// The value as shown, in the unit an absolute target is given in.
        func shown(_ value: Double) -> Double { self == .millisecondsFromMicroseconds ? value / 1000 : value }

        var symbol: String {
            switch self {
            case .milliseconds, .millisecondsFromMicroseconds: "ms"
            case .microseconds: "µs"
            case .mebibytes: "MiB"
            case .requestsPerSecond: "req/s"
            case .wakeUps, .count, .mean: ""
            }
        }
    }

    /// What a figure must reach.
    enum Target {
        case ratioAtMost(Double)
        case ratioAtLeast(Double)
        case atMost(Double)
        case atLeast(Double)
        /// At most the yardstick plus this much (wake-ups beyond the watchdog's pings).
        case atMostYardstickPlus(Double)
        /// At most this much, and at most this ratio to the yardstick.
        case atMostAndRatioAtMost(Double, ratio: Double)
        /// No target: shown to explain another figure.
        case none
    }

    /// One line of the table.
    struct Row {
        var figure: String
        var key: String
        var unit: Unit
        /// The yardstick's name and key.
        var yardstick: (name: String, key: String)?
        var target: Target
    }

    static let rows: [Row] =
        [
            Row(
                figure: "`brokerctl token NAME`, whole process, p50", key: "brokerctl_p50_ms", unit: .milliseconds,
                yardstick: ("oidc-token", "oidc_token_p50_ms"), target: .ratioAtMost(1.2)),
            Row(
                figure: "brokerd anonymous memory (RssAnon), idle after a token, 1 account",
                key: "rss_anon_idle_1_mib", unit: .mebibytes, yardstick: ("RssFile", "rss_file_idle_1_mib"),
                target: .atMost(4)),
            Row(
                figure: "brokerd anonymous memory (RssAnon), idle after a token, 1,000 accounts (800-byte tokens)",
                key: "rss_anon_idle_1000_mib", unit: .mebibytes, yardstick: ("RssFile", "rss_file_idle_1000_mib"),
                target: .atMost(16)),
        ] + cachedTokenRows(server: "token", label: "cached `token`")
        + [
            Row(
                figure: "durable save of one account's change, 1,000 accounts, p50", key: "save_p50_ms",
                unit: .milliseconds, yardstick: ("whole vault rewritten (format 1)", "save_whole_vault_p50_ms"),
                target: .atMost(2)),
            Row(
                figure: "start to READY=1, 1,000 accounts, p50", key: "ready_1000_p50_ms", unit: .milliseconds,
                target: .atMost(40)),
            Row(
                figure: "expired token, 1,000 waiting clients: last served after the IdP's answer",
                key: "expired_1000_last_after_idp_ms", unit: .milliseconds, target: .atMost(10)),
        ] + changeRows + idleRows + swiftNIORows + policyRows + dpopRows
        + cachedTokenRows(server: "loops1", label: "1 event loop: cached `token`")
        + cachedTokenRows(server: "loops2", label: "2 event loops: cached `token`") + fleetRows

    /// One account's `add`, `set_tokens` and `remove` over the socket beside 100, 1,000 and
    /// 10,000 accounts (`broker-bench changes`): at most 2 ms each, and with 10,000 at most 1.5x
    /// the figure with 100 of the same run, as a change costs the same however many there are.
    static let changeRows: [Row] = ["add", "set_tokens", "remove"].flatMap { operation in
        [(100, "100"), (1000, "1,000"), (10_000, "10,000")].map { size, label in
            Row(
                figure: "`\(operation)` of one account beside \(label) accounts, p50",
                key: "\(operation)_\(size)_p50_ms",
                unit: .milliseconds, yardstick: size == 100 ? nil : ("100 accounts", "\(operation)_100_p50_ms"),
                target: size == 10_000 ? .atMostAndRatioAtMost(2, ratio: 1.5) : .atMost(2))
        }
    }

    /// An idle brokerd's wake-ups over 60 s (`broker-bench idle`), beside ssh-agent's in the
    /// same run, and with a watchdog beside its pings.
    static let idleRows: [Row] = [
        Row(
            figure: "idle wake-ups over 60 s, 1 account valid 1 h, no watchdog (context switches)",
            key: "idle_wakeups", unit: .wakeUps, yardstick: ("ssh-agent", "ssh_agent_wakeups"), target: .atMost(2)),
        Row(
            figure: "the same with WATCHDOG_USEC=30000000", key: "idle_watchdog_wakeups", unit: .wakeUps,
            yardstick: ("watchdog pings", "idle_watchdog_pings"), target: .atMostYardstickPlus(2)),
    ]

    /// SwiftNIO's echo (`broker-bench echo-server`, brokerd's answer size, one event loop) beside
    /// the C floor, and brokerd beside it: what the event-loop library alone costs, and what the
    /// broker adds to it (brokerd's target: at least 0.7x SwiftNIO's echo).
    static let swiftNIORows: [Row] = [
        Row(
            figure: "SwiftNIO echo (no work, brokerd's answer size), 64 connections, req/s", key: "nioecho_64_rps",
            unit: .requestsPerSecond, yardstick: ("echo floor", "echo_64_rps"), target: .none),
        Row(
            figure: "SwiftNIO echo, 1 connection, p50", key: "nioecho_1_p50_us", unit: .microseconds,
            yardstick: ("echo floor", "echo_1_p50_us"), target: .none),
        Row(
            figure: "cached `token`, 64 connections, req/s, beside SwiftNIO's echo", key: "token_64_rps",
            unit: .requestsPerSecond, yardstick: ("SwiftNIO echo", "nioecho_64_rps"), target: .ratioAtLeast(0.7)),
    ]

    /// Cached tokens of an account behind a rule of three executables, beside the same broker
    /// without one in the same run (the target: at most 10% slower at 64 connections). Their p99
    /// figures are among the other figures.
    static let policyRows: [Row] = [
        Row(
            figure: "cached `token`, 3-executable policy, 64 connections, req/s", key: "policy_64_rps",
            unit: .requestsPerSecond, yardstick: ("no policy", "token_64_rps"), target: .ratioAtLeast(0.9)),
        Row(
            figure: "cached `token`, 3-executable policy, 1 connection, p50", key: "policy_1_p50_us",
            unit: .microseconds, yardstick: ("no policy", "token_1_p50_us"), target: .ratioAtMost(1.1)),
    ]

    /// Cached tokens of a DPoP account asked with a `dpop` object, each answer with a fresh proof
    /// (a whole ES256 signature, nothing made ahead), beside plain cached tokens of the same run
    /// (docs/dpop.md, "Signing"; the targets are docs/performance.md's).
    static let dpopRows: [Row] = [
        Row(
            figure: "cached `token` with a DPoP proof, 64 connections, proofs/s", key: "dpop_64_rps",
            unit: .requestsPerSecond, yardstick: ("plain token", "token_64_rps"), target: .atLeast(20_000)),
        Row(
            figure: "cached `token` with a DPoP proof, 1 connection, p50", key: "dpop_1_p50_us", unit: .microseconds,
            yardstick: ("plain token", "token_1_p50_us"), target: .ratioAtMost(4)),
        Row(
            figure: "cached `token` with a DPoP proof, 1 connection, p99", key: "dpop_1_p99_us", unit: .microseconds,
            yardstick: ("plain token", "token_1_p99_us"), target: .none),
    ]

    /// One account shared through the fleet's PostgreSQL (`broker-bench fleet`): one IdP call per
    /// rotation with 3 and with 10 brokers, and no refresh token presented twice; a shared refresh
    /// beside a local one, and its statements; cached tokens of a shared account as fast as of a
    /// local one on the same broker.
    static let fleetRows: [Row] =
        [3, 10].flatMap { brokers in
            [
                Row(
                    figure:
                        "fleet, \(brokers) brokers sharing one account (\(FleetBench.lifetime) s tokens): IdP calls per rotation",
                    key: "fleet_idp_calls_per_rotation_\(brokers)", unit: .mean, target: .atMost(1)),
                Row(
                    figure: "fleet, \(brokers) brokers: refresh tokens presented twice",
                    key: "fleet_reused_refresh_tokens_\(brokers)", unit: .count, target: .atMost(0)),
            ]
        } + [
            Row(
                figure: "fleet: forced refresh (`refresh`) of a shared account, p50",
                key: "fleet_refresh_latency_shared_ms",
                unit: .milliseconds, yardstick: ("local account", "fleet_refresh_latency_local_ms"), target: .none),
            Row(
                figure: "fleet: added by the store to a refresh (shared p50 - local p50)",
                key: "fleet_refresh_added_ms",
                unit: .milliseconds, target: .none),
            Row(
                figure: "fleet: database round trips (statements) per shared refresh",
                key: "fleet_db_round_trips_per_refresh", unit: .mean, target: .none),
            Row(
                figure: "fleet: cached `token` of a shared account, 64 connections, req/s",
                key: "fleet_cached_shared_rps",
                unit: .requestsPerSecond, yardstick: ("local account, same broker", "fleet_cached_local_rps"),
                target: .ratioAtLeast(0.9)),
        ]

    /// The four cached-token rows of one server (a key prefix of `broker-bench figures`). The
    /// requests per second at 64 connections stand beside the C floor without a target: the
    /// target is SwiftNIO's echo (`swiftNIORows`).
    static func cachedTokenRows(server: String, label: String) -> [Row] {
        [
            Row(
                figure: label + ", 64 connections, req/s", key: server + "_64_rps", unit: .requestsPerSecond,
                yardstick: ("echo floor", "echo_64_rps"), target: .none),
            Row(
                figure: label + ", 64 connections, p99", key: server + "_64_p99_us",
                unit: .millisecondsFromMicroseconds, yardstick: ("echo floor", "echo_64_p99_us"), target: .atMost(2)),
            Row(
                figure: label + ", 1 connection, p50", key: server + "_1_p50_us", unit: .microseconds,
                yardstick: ("echo floor", "echo_1_p50_us"), target: .ratioAtMost(1.2)),
            Row(
                figure: label + ", 1 connection, p99", key: server + "_1_p99_us", unit: .microseconds,
                yardstick: ("echo floor", "echo_1_p99_us"), target: .ratioAtMost(1.5)),
        ]
    }

    /// The figures on standard input: at most 1,000 lines of at most 4,096 bytes; finite numbers only.
    static func readFigures() -> [String: Double] {
        var figures: [String: Double] = [:]
        var lines = 0
        while lines < 1000, let line = readLine() {
            lines += 1
            guard line.utf8.count <= 4096 else { continue }
            if line.hasPrefix("{"),
                let object = try? JSONDecoder().decode([String: Double].self, from: Data(line.utf8))
            {
                figures.merge(object.filter { $0.value.isFinite }) { $1 }
                continue
            }
            for word in line.split(separator: " ") {
                let parts = word.split(separator: "=", maxSplits: 1)
                guard parts.count == 2, let value = Double(parts[1]), value.isFinite else { continue }
                figures[String(parts[0])] = value
            }
        }
        return figures
    }

    static func printTable(figures: [String: Double]) {
        print("| figure | measured | yardstick (same run) | ratio | target | met? |")
        print("|---|---|---|---|---|---|")
        for row in rows {
            print("| " + cells(row, figures: figures).joined(separator: " | ") + " |")
        }
        if let loops = figures["default_event_loops"] {
            print("\nbrokerd as shipped (TOKENBROKER_EVENT_LOOPS unset) ran \(Int(loops)) event loop(s).")
        }
        let shown = Set(rows.flatMap { [$0.key, $0.yardstick?.key].compactMap { $0 } } + ["default_event_loops"])
        let others = figures.filter { !shown.contains($0.key) }.sorted { $0.key < $1.key }
        if !others.isEmpty {
            print("\nOther figures of this run:")
            for (key, value) in others { print("  \(key)=\(decimal(value, places: 3))") }
        }
    }

    /// The cells of `row`: figure, measured, yardstick, ratio, target, met.
    static func cells(_ row: Row, figures: [String: Double]) -> [String] {
        let yardstickName = row.yardstick.map { $0.name } ?? ""
        let target: String
        switch row.target {
        case .ratioAtMost(let ratio): target = "≤ \(decimal(ratio, places: 1))x \(yardstickName)"
        case .ratioAtLeast(let ratio): target = "≥ \(decimal(ratio, places: 1))x \(yardstickName)"
        case .atMost(let limit): target = "≤ \(decimal(limit, places: 0)) \(row.unit.symbol)"
        case .atLeast(let limit): target = "≥ \(decimal(limit, places: 0)) \(row.unit.symbol)"
        case .atMostYardstickPlus(let extra): target = "≤ \(yardstickName) + \(decimal(extra, places: 0))"
        case .atMostAndRatioAtMost(let limit, let ratio):
            target =
                "≤ \(decimal(limit, places: 0)) \(row.unit.symbol), ≤ \(decimal(ratio, places: 1))x \(yardstickName)"
        case .none: target = "-"
        }
        guard let measured = figures[row.key] else { return [row.figure, "not measured", "-", "-", target, "-"] }
        let yardstick = row.yardstick.flatMap { figures[$0.key] }
        let ratio = yardstick.flatMap { $0 > 0 ? measured / $0 : nil }
        let met: Bool?
        switch row.target {
        case .ratioAtMost(let limit): met = ratio.map { $0 <= limit }
        case .ratioAtLeast(let limit): met = ratio.map { $0 >= limit }
        case .atMost(let limit): met = row.unit.shown(measured) <= limit
        case .atLeast(let limit): met = row.unit.shown(measured) >= limit
        case .atMostYardstickPlus(let extra): met = yardstick.map { measured <= $0 + extra }
        case .atMostAndRatioAtMost(let limit, let most):
            met = ratio.map { $0 <= most && row.unit.shown(measured) <= limit }
        case .none: met = nil
        }
        return [
            row.figure, row.unit.show(measured),
            yardstick.map { row.unit.show($0) + " (" + yardstickName + ")" } ?? "-",
            ratio.map { decimal($0, places: 2) + "x" } ?? "-", target, met.map { $0 ? "yes" : "no" } ?? "-",
        ]
    }

    /// `value` with `places` decimals (no Foundation formatting).
    static func decimal(_ value: Double, places: Int) -> String {
        guard value.isFinite, abs(value) < 1e15 else { return "-" }
        var scale = 1.0
        for _ in 0..<places { scale *= 10 }
        let scaled = Int((abs(value) * scale).rounded())
        let whole = String(scaled / Int(scale))
        let sign = value < 0 && scaled != 0 ? "-" : ""
        guard places > 0 else { return sign + whole }
        let fraction = String(scaled % Int(scale))
        return sign + whole + "." + String(repeating: "0", count: places - fraction.count) + fraction
    }
}
