import BrokerProtocol
import FoundationEssentials

/// Text quoted for a POSIX shell, so a command shown to the user can be pasted as it is.
enum ShellWord {
    /// `text` as it is when it holds only characters no shell reads specially, else in single quotes.
    static func quoted(_ text: String) -> String {
        let plain =
            !text.isEmpty
            && text.utf8.allSatisfy { byte in
                (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                    || Array("/._-@%+=:,".utf8).contains(byte)
            }
        return plain ? text : "'" + text.replacing("'", with: #"'\''"#) + "'"
    }
}
