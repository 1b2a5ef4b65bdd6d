import Foundation
import Testing

/// ARCHITECTURE.md's module map is the rule for which module may import which: every
/// dependency `Package.swift` gives a target and every `import` in its sources must be an arrow
/// of that map, so that a layer of the core cannot reach the edge (or a layer above it) without
/// the map saying so first.
@Suite struct ModuleGraphTests {
    /// The repository's root, three folders above this file.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test func everyDependencyAndImportIsAnArrowOfTheMap() throws {
        let map = try ModuleMap(
            markdown: String(contentsOf: Self.root.appending(path: "ARCHITECTURE.md"), encoding: .utf8))
        let package = try PackageTargets(
            manifest: String(contentsOf: Self.root.appending(path: "Package.swift"), encoding: .utf8))
        let local = Set(package.dependencies.keys)
        #expect(local.count > 10, "Package.swift's targets were read: \(local.sorted())")
        var missing: [String] = []
        for (target, dependencies) in package.dependencies.sorted(by: { $0.key < $1.key }) {
            let imports = try Self.imports(of: target)
            guard let allowed = map.arrows[target] else {
                // A Swift module of Sources/ must be on the map; C modules import nothing of ours.
                if !imports.isEmpty { missing.append("\(target) is not in the map") }
                continue
            }
            for dependency in dependencies.sorted() where local.contains(dependency) && !allowed.contains(dependency) {
                missing.append("Package.swift: \(target) ──► \(dependency)")
            }
            for (file, module) in imports where local.contains(module) && module != target {
                if !allowed.contains(module) { missing.append("\(file): \(target) ──► \(module)") }
            }
        }
        #expect(
            missing.isEmpty, "arrows ARCHITECTURE.md's module map does not show:\n\(missing.joined(separator: "\n"))")
    }

    @Test func theMapIsReadAsWritten() throws {
        let map = try ModuleMap(
            markdown: "text\n```text\nA ──► B, C\nB ──►\nC ──► B (a note)\n```\n```text\nD ──► A\n```\n")
        #expect(map.arrows == ["A": ["B", "C"], "B": [], "C": ["B"]])
    }

    /// Each `import` of the Swift files under `Sources/TARGET` (attributes such as
    /// `@testable` and kinds such as `struct` allowed), with the file's path; none for a folder
    /// outside Sources/ (test support, the bench) or of C sources.
    static func imports(of target: String) throws -> [(String, String)] {
        let folder = root.appending(path: "Sources/\(target)")
        guard let files = FileManager.default.enumerator(at: folder, includingPropertiesForKeys: nil) else { return [] }
        var found: [(String, String)] = []
        for case let file as URL in files where file.pathExtension == "swift" {
            for line in try String(contentsOf: file, encoding: .utf8).split(separator: "\n") {
                let words = line.split(separator: " ").filter { !$0.hasPrefix("@") }
                guard words.first == "import", let last = words.last else { continue }
                found.append(
                    (
                        file.path.replacingOccurrences(of: root.path + "/", with: ""),
                        String(last.split(separator: ".")[0])
                    ))
            }
        }
        return found
    }
}

/// The arrows of ARCHITECTURE.md's first `text` block: lines `MODULE ──► A, B, C`.
struct ModuleMap {
    var arrows: [String: Set<String>] = [:]

    init(markdown: String) throws {
        guard let start = markdown.range(of: "```text\n"),
            let end = markdown.range(of: "```", range: start.upperBound..<markdown.endIndex)
        else { throw MapError.noBlock }
        for line in markdown[start.upperBound..<end.lowerBound].split(separator: "\n") {
            let sides = line.components(separatedBy: "──►")
            guard sides.count == 2 else { throw MapError.notAnArrow(String(line)) }
            let targets = sides[1].split(separator: ",").compactMap {
                $0.split(separator: " ").first.map(String.init)
            }
            arrows[sides[0].trimmingCharacters(in: .whitespaces)] = Set(targets)
        }
    }

    enum MapError: Error { case noBlock, notAnArrow(String) }
}

/// The local dependencies of each `.target`, `.executableTarget` and `.systemLibrary` of a
/// manifest written as this package's is: a `name:` followed by a `dependencies: [...]` list
/// of quoted names (`.product(...)` entries, other packages' modules, are left out).
struct PackageTargets {
    var dependencies: [String: Set<String>] = [:]

    init(manifest: String) throws {
        let declaration = try Regex(
            #"\.(target|executableTarget|systemLibrary)\(\s*name:\s*"([^"]+)"(?:\s*,\s*dependencies:\s*\[([^\]]*)\])?"#)
        for match in manifest.matches(of: declaration) {
            guard let name = match.output[2].substring else { continue }
            let list = (match.output[3].substring.map(String.init) ?? "").replacing(
                try Regex(#"\.product\([^)]*\)"#), with: "")
            let names = list.matches(of: try Regex(#""([^"]+)""#)).compactMap {
                $0.output[1].substring.map(String.init)
            }
            dependencies[String(name)] = Set(names)
        }
    }
}
