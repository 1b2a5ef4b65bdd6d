/// Text put into the small HTML pages of a browser login (brokerctl's page, the loopback
/// listener's answers).
public enum HTMLText {
    /// `text` fit for an HTML page or attribute: `&`, `<`, `>`, `"` and `'` as character references.
    public static func escaped(_ text: String) -> String {
        var html = ""
        for character in text {
            switch character {
            case "&": html += "&amp;"
            case "<": html += "&lt;"
            case ">": html += "&gt;"
            case "\"": html += "&quot;"
            case "'": html += "&#39;"
            default: html.append(character)
            }
        }
        return html
    }
}
