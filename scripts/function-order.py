"""Prints the functions brokerd runs in a day's typical work, one symbol per line, steady work
first (see scripts/function-order). Usage: function-order.py WORKDIR, with WORKDIR/brokerd the binary."""

import bisect
import http.server
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

work = sys.argv[1]
brokerd = os.path.join(work, "brokerd")
# Only this run's directories: no variable may point brokerd at the user's own socket or vault.
foreign = ("TOKENBROKER_", "STATE_DIRECTORY", "CONFIGURATION_DIRECTORY", "CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET",
           "LISTEN_")
environment = {name: value for name, value in os.environ.items() if not name.startswith(foreign)}
for name, directory in [("XDG_RUNTIME_DIR", "run"), ("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state")]:
    os.makedirs(os.path.join(work, directory), mode=0o700)
    environment[name] = os.path.join(work, directory)
environment["HOME"] = work
socket_path = os.path.join(work, "run", "tokenbroker", "broker.sock")


class IdP(http.server.BaseHTTPRequestHandler):
    """A token endpoint that rotates refresh tokens and issues short access tokens."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.dumps({
            "access_token": secrets.token_hex(400), "token_type": "Bearer", "expires_in": 3600,
            "refresh_token": secrets.token_hex(20),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *arguments):
        pass


idp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), IdP)
threading.Thread(target=idp.serve_forever, daemon=True).start()
endpoint = "http://127.0.0.1:%d/token" % idp.server_address[1]


def start(command):
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not os.path.exists(socket_path):
        if time.time() > deadline or process.poll() is not None:
            process.kill()
            process.wait()
            sys.exit("brokerd did not start")
        time.sleep(0.1)
    return process


def stop(process):
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)


class Connection:
    def __init__(self):
        self.socket = socket.socket(socket.AF_UNIX)
        self.socket.connect(socket_path)
        self.file = self.socket.makefile("rwb")
        self.next = 0

    def send(self, **request):
        self.next += 1
        self.file.write((json.dumps(dict(id=self.next, **request)) + "\n").encode())
        self.file.flush()

    def ask(self, **request):
        self.send(**request)
        while True:
            answer = json.loads(self.file.readline())
            if answer.get("id") == self.next and "event" not in answer:
                return answer


def tokens(expires_in):
    return {"access_token": secrets.token_hex(400), "expires_in": expires_in}


# The vault brokerd starts from: a static account and an oauth2 account with a token.
process = start([brokerd])
setup = Connection()
setup.ask(op="add", account="static", provider={"kind": "static"}, tokens=tokens(86400))
oauth2 = {"kind": "oauth2", "token_endpoint": endpoint, "client_id": "order"}
setup.ask(op="add", account="api", provider=oauth2, tokens={"refresh_token": secrets.token_hex(20)})
setup.ask(op="token", account="api")
stop(process)

output = os.path.join(work, "callgrind.out")
process = start(["valgrind", "--tool=callgrind", "--demangle=no", "--callgrind-out-file=" + output, brokerd])


def end_phase():
    """Writes what callgrind counted since the last phase ended to callgrind.out.N."""
    subprocess.run(["callgrind_control", "--dump", str(process.pid)], check=True, stdout=subprocess.DEVNULL)


try:
    client = Connection()
    watcher = Connection()
    watcher.ask(op="subscribe")
    # Start-up's one-time work (and IdleMemoryRelease's first round) ends here.
    time.sleep(2)
    end_phase()
    for index in range(200):
        client.ask(op="token", account="static")
        client.ask(op="token", account="api", min_ttl=60)
        if index % 4 == 0:
            # As `brokerctl token` does: a connection of its own, closed after the answer.
            once = Connection()
            once.ask(op="token", account="static")
            once.file.close()
            once.socket.close()
    end_phase()
    client.ask(op="status")
    client.ask(op="status", account="api")
    token = client.ask(op="token", account="api")["result"]["access_token"]
    client.ask(op="reject", account="api", access_token=token)
    client.ask(op="token", account="api")
    client.ask(op="set_tokens", account="static", tokens=tokens(3600))
    client.ask(op="add", account="later", provider={"kind": "static"}, tokens=tokens(600))
    client.ask(op="remove", account="later")
    client.ask(op="token", account="nobody")
    client.ask(op="hello", versions=[1])
    client.ask(op="refresh", account="api")
    client.ask(op="reload")
finally:
    stop(process)
idp.shutdown()


# callgrind names some code by address only ("0x0000000000dc8ea0", "'2" marks a recursion
# depth); the nearest symbol before it names the function section that holds it.
symbols = []
for line in subprocess.run(["nm", "-S", "--defined-only", brokerd], capture_output=True, text=True,
                           check=True).stdout.splitlines():
    fields = line.split()
    if len(fields) == 4 and fields[2] in "tTwW":
        symbols.append((int(fields[0], 16), int(fields[1], 16), fields[3]))
symbols.sort()
starts = [start for start, _, _ in symbols]


def symbol_named(name):
    match = re.match(r"^0x([0-9a-f]+)(?:'\d+)?$", name)
    if not match:
        return name
    address = int(match.group(1), 16)
    index = bisect.bisect_right(starts, address) - 1
    # Past the end of the symbol before it, the code still lies in that function's section
    # (a merged body or a tail the symbol's size leaves out): ordering the symbol moves it.
    return symbols[index][2] if index >= 0 else name


def functions_run(path):
    """brokerd's functions in one callgrind output, with the instructions each ran itself.

    callgrind names each function once, as `fn=(N) name`, and refers to it by `(N)` after that;
    `ob=` says which binary the functions that follow belong to. A cost line follows each
    `calls=` line: the callee's cost, not the caller's own."""
    objects, functions, cost = {}, {}, {}
    current_object, current, skip_next = "", None, False
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        match = re.match(r"^(c?ob|c?fn)=\((\d+)\)(?: (.*))?$", line)
        if match:
            kind, number, name = match.groups()
            table = objects if kind.endswith("ob") else functions
            if name:
                table[number] = name
            if kind == "ob":
                current_object = objects.get(number, "")
            elif kind == "fn":
                current = symbol_named(functions[number]) if current_object.endswith("/brokerd") else None
                if current is not None:
                    cost.setdefault(current, 0)
            continue
        if line.startswith("calls="):
            skip_next = True
            continue
        fields = line.split()
        if len(fields) >= 2 and fields[0][0] in "0123456789+-*" and fields[1].isdigit():
            if current is not None and not skip_next:
                cost[current] += int(fields[1])
            skip_next = False
    return cost


# Steady work first, hottest first: the cached-token loop, then the other requests, then what
# only start-up runs. IdleMemoryRelease unmaps start-up's code; what runs after that then
# lies in as few pages as it can.
start_up, cached, rest = (functions_run(output + suffix) for suffix in (".1", ".2", ""))
order, seen = [], set()
for phase in (cached, rest, start_up):
    for name in sorted(phase, key=lambda name: (-phase[name], name)):
        if name not in seen:
            seen.add(name)
            order.append(name)
print("\n".join(order))
