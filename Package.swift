// swift-tools-version: 6.0
import PackageDescription

let upcoming: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

/// How brokerd is linked. `-static-stdlib` puts the Swift runtime and FoundationEssentials inside
/// it (the toolchain's autolink entries miss FoundationEssentials' own two libraries, named here);
/// libsodium and libsystemd stay shared. lld packs the relative relocations (DT_RELR, glibc
/// 2.36+: brokerd reads and applies 15 KB of them at start instead of 1.8 MB) and does not repeat
/// gold's link-time warning about `mktemp` inside FoundationEssentials. `--no-export-dynamic`
/// undoes the toolchain's `-export-dynamic`: nothing loads plugins into these programs, and
/// 28,000 exported symbols were 1.4 MB of dynamic symbol tables paged in at every start.
let staticStdlib: [LinkerSetting] = [
    .unsafeFlags([
        "-static-stdlib", "-use-ld=lld", "-Xlinker", "-z", "-Xlinker", "pack-relative-relocs",
        "-Xlinker", "--no-export-dynamic",
    ]),
    .linkedLibrary("_FoundationCollections"), .linkedLibrary("_FoundationCShims"),
    // PostgresNIO (the fleet's store) imports Foundation, whose time zones and formats are ICU's.
    .linkedLibrary("_FoundationICU"), .linkedLibrary("CoreFoundation"),
]

/// How brokerctl is linked: one static executable, glibc and libstdc++ inside, so that no
/// dynamic loader runs (a static "hello world" starts in 0.45 ms of CPU here, against 1.6 ms
/// with `-static-stdlib` and the shared libstdc++: most of what `brokerctl token` cost). It is not
/// position-independent: glibc's static-PIE start refuses the `$ORIGIN` run path SwiftPM gives
/// every executable. brokerctl resolves no host names; its one user lookup, the home directory
/// when `$HOME` is unset, goes through static glibc's NSS, which loads the system's modules and
/// so needs the glibc it was built with (the link warns of that).
let staticExecutable: [LinkerSetting] = [
    .unsafeFlags(["-static-executable", "-use-ld=lld"]),
    .linkedLibrary("_FoundationCollections"), .linkedLibrary("_FoundationCShims"),
]

let package = Package(
    name: "tokenbroker",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "brokerd", targets: ["brokerd"]),
        .executable(name: "brokerctl", targets: ["brokerctl"]),
        .executable(name: "broker-bench", targets: ["broker-bench"]),
        .library(name: "BrokerClient", targets: ["BrokerClient"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        // The tests' own ES256 (BoringSSL), which checks the DPoP proofs brokerd signs with OpenSSL.
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
    ],
    targets: [
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"])]
        ),
        // OpenSSL's libcrypto: the ES256 keys and signatures of DPoP proofs (`P256Signer`).
        // libqrencode: the QR code of a device login's link, drawn in brokerd so that brokerctl
        // stays one static executable (Debian ships no static libqrencode).
        .systemLibrary(
            name: "CQREncode",
            pkgConfig: "libqrencode",
            providers: [.apt(["libqrencode-dev"])]
        ),
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "libcrypto",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        .target(name: "CSpawn"),
        // How every child process starts: the exec provider's, brokerctl's, the tests'.
        .target(name: "ProcessSpawn", dependencies: ["CSpawn"], swiftSettings: upcoming),
        // timerfd(2) for the refresh scheduler's wall-clock timer (libc's own; nothing to link).
        .systemLibrary(name: "CTimerFD"),
        // fallocate(2) keeping the size, for the vault log's reserve (libc's own; nothing to link).
        .systemLibrary(name: "CFileSpace"),
        // brokerd's heap: wipe-on-free `free` and `realloc`, and a kept trim threshold; linked
        // into brokerd only.
        .target(name: "CWipeOnFree"),
        // Sets the Swift runtime's global-enqueue hook, so that brokerd runs its tasks on its
        // event loops (`EventLoops.takeOver`); linked into brokerd only.
        .target(name: "CGlobalExecutorHook"),
        .target(name: "BrokerProtocol", swiftSettings: upcoming),
        // The broker's core, in layers that import only the layers below them (ARCHITECTURE.md,
        // "Modules"; `ModuleGraphTests` holds every import to that map). None of them opens a
        // socket or encodes the wire.
        // The words every layer speaks: account names, the broker's failures, how to restore an account.
        .target(name: "BrokerModel", dependencies: ["BrokerProtocol"], swiftSettings: upcoming),
        // Secrets in guarded memory, libsodium, and the file-system trust every file read goes through.
        .target(
            name: "BrokerSecrets",
            dependencies: [
                "BrokerModel", "CFileSpace", "CSodium",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming
        ),
        // The IdP side: an account's record, the providers, discovery, the login flows and DPoP.
        .target(
            name: "BrokerIdP",
            dependencies: [
                "BrokerModel", "BrokerProtocol", "BrokerSecrets", "COpenSSL", "CQREncode", "ProcessSpawn",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming
        ),
        // The vault: records encrypted at rest in a snapshot and a log.
        .target(
            name: "BrokerVault",
            dependencies: ["BrokerIdP", "BrokerModel", "BrokerProtocol", "BrokerSecrets"],
            swiftSettings: upcoming
        ),
        // The engine: the `Broker` actor, the account machines, scheduling, the cache, the
        // configuration and the fleet's rows apart from the database.
        .target(
            name: "BrokerEngine",
            dependencies: [
                "BrokerIdP", "BrokerModel", "BrokerProtocol", "BrokerSecrets", "BrokerVault", "CTimerFD",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            name: "BrokerServer",
            dependencies: [
                "BrokerProtocol", "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: upcoming
        ),
        // The fleet's shared store: shared accounts in PostgreSQL rows sealed with the fleet key,
        // one lease per account, versions compared and swapped (docs/fleet.md).
        .target(
            name: "BrokerFleet",
            dependencies: [
                "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            name: "BrokerSystemd",
            dependencies: [
                "CSystemd",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            swiftSettings: upcoming
        ),
        .executableTarget(
            name: "brokerd",
            dependencies: [
                "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault", "BrokerFleet",
                "BrokerServer", "BrokerSystemd", "CGlobalExecutorHook", "CWipeOnFree",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming,
            linkerSettings: staticStdlib
        ),
        .target(name: "BrokerClient", dependencies: ["BrokerProtocol"], swiftSettings: upcoming),
        .executableTarget(
            name: "brokerctl",
            dependencies: [
                "BrokerClient", "BrokerProtocol", "CSpawn", "ProcessSpawn",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: upcoming,
            linkerSettings: staticExecutable
        ),
        // What every test target and the bench share: test IdPs, the broker harnesses, raw
        // connections and child processes.
        .target(
            name: "TestSupport",
            dependencies: [
                "BrokerClient", "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault",
                "BrokerProtocol", "BrokerServer", "CSodium", "ProcessSpawn",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Tests/TestSupport",
            swiftSettings: upcoming
        ),
        .executableTarget(
            name: "broker-bench",
            dependencies: [
                "BrokerProtocol", "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault",
                "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "bench/Sources/broker-bench",
            swiftSettings: upcoming,
            // lld, as for brokerd and brokerctl.
            linkerSettings: [.unsafeFlags(["-use-ld=lld"])]
        ),
        // ARCHITECTURE.md's module map against Package.swift and every source file's imports.
        .testTarget(name: "ArchitectureTests", swiftSettings: upcoming),
        .testTarget(name: "BrokerProtocolTests", dependencies: ["BrokerProtocol"], swiftSettings: upcoming),
        .testTarget(
            name: "BrokerCoreTests",
            dependencies: [
                "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault", "TestSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: upcoming
        ),
        // `login` in process, as BrokerCoreTests drive the engine, with the broker's own loopback
        // listener on 127.0.0.1 for the browser flow; the flows' waits run on the test's clock.
        .testTarget(
            name: "BrokerLoginTests",
            dependencies: [
                "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault", "BrokerProtocol",
                "BrokerServer", "TestSupport",
            ],
            swiftSettings: upcoming
        ),
        // The exec provider against real child processes, with their real timeouts: the one part
        // of the engine that cannot run on a test clock.
        .testTarget(
            name: "BrokerProcessTests",
            dependencies: ["BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault", "TestSupport"],
            swiftSettings: upcoming),
        .testTarget(
            name: "BrokerServerTests",
            dependencies: [
                "BrokerServer", "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault",
                "BrokerProtocol", "TestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            swiftSettings: upcoming
        ),
        // The shared store against a real PostgreSQL server that each suite starts
        // (`PostgresServer`).
        .testTarget(
            name: "BrokerFleetTests",
            dependencies: [
                "BrokerFleet", "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault",
                "TestSupport",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming),
        .testTarget(
            name: "BrokerSystemdTests", dependencies: ["BrokerSystemd", "TestSupport"], swiftSettings: upcoming),
        // Both clients against a scripted stand-in broker on a Unix socket.
        .testTarget(
            name: "BrokerClientTests", dependencies: ["BrokerClient", "BrokerProtocol", "TestSupport"],
            swiftSettings: upcoming),
        // Runs the brokerd and brokerctl binaries that `swift build` leaves beside it; it does not
        // depend on their targets, which would link their static runtime into the test bundle.
        .testTarget(
            name: "IntegrationTests",
            dependencies: ["BrokerClient", "BrokerProtocol", "TestSupport"],
            exclude: ["Fixtures"],
            swiftSettings: upcoming
        ),
    ]
)
