// swift-tools-version: 6.0
import PackageDescription

/// libFuzzer's coverage instrumentation and AddressSanitizer, for the project's own modules and
/// the fuzz targets only:
/// the dependencies (NIO, AsyncHTTPClient) build as usual.
let instrumented: [SwiftSetting] = [
    .unsafeFlags(["-sanitize=fuzzer,address", "-enable-testing"]),
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

/// A fuzz target: an executable that hands its inputs to libFuzzer's driver.
func fuzzTarget(_ name: String, _ dependencies: [Target.Dependency]) -> Target {
    .executableTarget(
        name: name, dependencies: ["FuzzSupport"] + dependencies, path: "Targets/\(name)",
        swiftSettings: instrumented, linkerSettings: [.unsafeFlags(["-sanitize=fuzzer,address"])])
}

/// The project's fuzz targets. `Linked` points at the project's `Sources`, so the modules
/// under test are compiled here a second time, with coverage, from the very same files; their
/// dependencies mirror the project's `Package.swift`.
let package = Package(
    name: "tokenbroker-fuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
    ],
    targets: [
        .systemLibrary(name: "CSodium", path: "Linked/CSodium", pkgConfig: "libsodium"),
        .systemLibrary(name: "COpenSSL", path: "Linked/COpenSSL", pkgConfig: "libcrypto"),
        .systemLibrary(name: "CTimerFD", path: "Linked/CTimerFD"),
        .systemLibrary(name: "CQREncode", path: "Linked/CQREncode", pkgConfig: "libqrencode"),
        .systemLibrary(name: "CFileSpace", path: "Linked/CFileSpace"),
        .target(name: "CSpawn", path: "Linked/CSpawn"),
        .target(
            name: "ProcessSpawn", dependencies: ["CSpawn"], path: "Linked/ProcessSpawn", swiftSettings: instrumented),
        .target(name: "BrokerProtocol", path: "Linked/BrokerProtocol", swiftSettings: instrumented),
        .target(
            name: "BrokerModel", dependencies: ["BrokerProtocol"], path: "Linked/BrokerModel",
            swiftSettings: instrumented),
        .target(
            name: "BrokerSecrets",
            dependencies: ["BrokerModel", "CFileSpace", "CSodium", .product(name: "Logging", package: "swift-log")],
            path: "Linked/BrokerSecrets", swiftSettings: instrumented),
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
            path: "Linked/BrokerIdP", swiftSettings: instrumented),
        .target(
            name: "BrokerVault", dependencies: ["BrokerIdP", "BrokerModel", "BrokerProtocol", "BrokerSecrets"],
            path: "Linked/BrokerVault", swiftSettings: instrumented),
        .target(
            name: "BrokerEngine",
            dependencies: [
                "BrokerIdP", "BrokerModel", "BrokerProtocol", "BrokerSecrets", "BrokerVault", "CTimerFD",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Linked/BrokerEngine", swiftSettings: instrumented),
        .target(name: "FuzzSupport", path: "Targets/FuzzSupport"),
        fuzzTarget("RequestLineFuzz", ["BrokerProtocol"]),
        fuzzTarget("ProviderFuzz", ["BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault"]),
        fuzzTarget("ConfigFuzz", ["BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault"]),
        fuzzTarget(
            "VaultFuzz",
            [
                "BrokerEngine", "BrokerIdP", "BrokerModel", "BrokerSecrets", "BrokerVault", "CSodium",
                .product(name: "Logging", package: "swift-log"),
            ]),
    ]
)
