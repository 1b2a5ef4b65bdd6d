"""Where the broker's socket is, computed exactly as BrokerProtocol's ``DefaultPaths.socket``."""

import os
import pwd
from typing import Mapping, Optional


def default_socket(environment: Optional[Mapping[str, str]] = None) -> str:
    """``$TOKENBROKER_SOCKET``, else ``$XDG_RUNTIME_DIR/tokenbroker/broker.sock``. Without a
    runtime dir: logind's ``/run/user/UID`` when it exists, else the user's own state directory
    (``$XDG_STATE_HOME``, ``~/.local/state``); never a name under a shared directory such as /tmp."""
    env = os.environ if environment is None else environment

    def non_empty(name: str) -> Optional[str]:
        value = env.get(name)
        return value if value else None

    socket = non_empty("TOKENBROKER_SOCKET")
    if socket:
        return socket
    runtime = non_empty("XDG_RUNTIME_DIR")
    if runtime is None:
        login_runtime = f"/run/user/{os.getuid()}"
        if os.path.exists(login_runtime):
            runtime = login_runtime
    if runtime is None:
        home = non_empty("HOME") or pwd.getpwuid(os.getuid()).pw_dir
        runtime = non_empty("XDG_STATE_HOME") or home + "/.local/state"
    return runtime + "/tokenbroker/broker.sock"
