import BrokerModel
import BrokerSecrets

/// A local vault record's part in the fleet (docs/fleet.md, "Moving an account" and "A commit
/// the database missed"). A marked record is written before the step that could leave an
/// account in two places or none, so that a broker started again after a crash finishes or
/// undoes that step (`Broker.settleFleetMarks`).
public struct FleetMark: Codable, Sendable, Equatable {
    public enum Step: String, Codable, Sendable {
        /// Being shared: a local account whose row may be in the store already (then it carries
        /// this mark's `id`) and is the live one.
        case sharing
        /// Being unshared: the row read at `version`, kept here before that row is deleted.
        case unsharing
        /// A shared account's refresh the store has not taken: the rotated record, to commit over
        /// `version`.
        case uncommitted
    }

    public var step: Step
    /// The row's version the step is about (`sharing`: 1, the version a new row gets).
    public var version: Int64
    /// The share (`SharedRecord.newShareID`): for `sharing`, the new row's, so that a broker
    /// tells its own new row from another host's row of the same name; for `uncommitted`, the
    /// share of the row the commit goes over.
    public var id: String?

    public init(step: Step, version: Int64, id: String? = nil) {
        self.step = step
        self.version = version
        self.id = id
    }
}
