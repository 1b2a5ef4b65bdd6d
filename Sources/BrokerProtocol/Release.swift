/// The release brokerd, brokerctl and the helpers belong to, as `--version` prints it.
public enum Release {
    public static let version = "0.1.0"
}
