// swift-tools-version: 6.0
import PackageDescription

let upcoming: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
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
        .package(url: "https://github.com/LebJe/TOMLKit", from: "0.6.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CSodium",
            pkgConfig: "libsodium",
            providers: [.apt(["libsodium-dev"])]
        ),
        .systemLibrary(
            name: "CSystemd",
            pkgConfig: "libsystemd",
            providers: [.apt(["libsystemd-dev"])]
        ),
        .target(name: "CSpawn"),
        .target(name: "BrokerProtocol", swiftSettings: upcoming),
        .target(
            name: "BrokerCore",
            dependencies: [
                "BrokerProtocol", "CSodium", "CSpawn",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "TOMLKit", package: "TOMLKit"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            name: "BrokerServer",
            dependencies: [
                "BrokerProtocol", "BrokerCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
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
                "BrokerCore", "BrokerServer", "BrokerSystemd",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: upcoming
        ),
        .target(name: "BrokerClient", dependencies: ["BrokerProtocol"], swiftSettings: upcoming),
        .executableTarget(
            name: "brokerctl",
            dependencies: [
                "BrokerClient", "BrokerProtocol",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: upcoming
        ),
        .target(
            name: "TestIdP",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Tests/TestIdP",
            swiftSettings: upcoming
        ),
        .executableTarget(
            name: "broker-bench",
            dependencies: [
                "BrokerProtocol", "TestIdP",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "bench/Sources/broker-bench",
            swiftSettings: upcoming
        ),
        .testTarget(name: "BrokerProtocolTests", dependencies: ["BrokerProtocol"], swiftSettings: upcoming),
        .testTarget(
            name: "BrokerCoreTests",
            dependencies: [
                "BrokerCore", "TestIdP",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: upcoming
        ),
        .testTarget(name: "BrokerSystemdTests", dependencies: ["BrokerSystemd"], swiftSettings: upcoming),
        .testTarget(
            name: "IntegrationTests",
            dependencies: ["BrokerClient", "BrokerProtocol", "TestIdP", "brokerd", "brokerctl"],
            exclude: ["Fixtures"],
            swiftSettings: upcoming
        ),
    ]
)
