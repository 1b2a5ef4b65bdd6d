import BrokerModel
import BrokerProtocol
import BrokerSecrets

/// The fields of a `provider` object as a kind reads them: each read checks the field's type
/// and names the field in its `bad_request`. An absent field and `null` both read as `nil`.
package struct ProviderFields {
    package let spec: ProviderSpec
    /// Whether the vault already holds the account's client secret (a declared account's, or
    /// the one `update` keeps), so client authentication that needs one has it.
    package var holdsClientSecret = false

    /// A string field.
    package func text(_ name: String) throws(BrokerFailure) -> String? {
        guard let value = present(name) else { return nil }
        guard let text = value.text else { throw .invalid("\"\(name)\" must be a string") }
        return text
    }

    /// An array-of-strings field.
    package func texts(_ name: String) throws(BrokerFailure) -> [String]? {
        guard let value = present(name) else { return nil }
        guard let texts = value.texts else {
            throw .invalid("\"\(name)\" must be an array of strings")
        }
        return texts
    }

    /// Checks that `field`, if given, has its declared type.
    package func check(_ field: ProviderField) throws(BrokerFailure) {
        switch field.type {
        case .text: _ = try text(field.name)
        case .texts: _ = try texts(field.name)
        }
    }

    private func present(_ name: String) -> JSONValue? {
        guard let value = spec.fields[name], value != .null else { return nil }
        return value
    }
}
