"""An agent's network: a namespace of its own, where only its model's API is reachable, through a proxy the
harness runs outside (issue 51).

Why: with the host's network an agent reached every service on localhost (a Jupyter server, Ray's dashboard, a
database, a dev server: some run code on request) and abstract Unix sockets, all outside every sandbox.

How, and why this way (Anthropic's sandbox-runtime does the same; pasta or slirp4netns would give the namespace
the whole internet instead, and would need a filtering proxy behind them anyway):
- the agent's sandbox unshares the network (bubblewrap: only a loopback interface inside, no route out);
- inside, a relay (relay(): this file run as a script, `python -I netproxy.py SOCKET PORT -- COMMAND...`,
  before anything of the agent's; the standard library only) listens on 127.0.0.1:RELAY_PORT of
  that namespace and hands every connection to a Unix socket bound in from the harness; the agent finds it
  through HTTPS_PROXY (Claude Code, Codex, aider and git honour it);
- outside, this proxy answers HTTP CONNECT for the hosts on the agent's allowlist only (its model's API: HOSTS,
  plus AUTORESEARCH_AGENT_HOSTS), on port 443 unless a host:port names another, and refuses anything else with
  403, keeping what it refused for the user. The agent never learns an address of the host's, and the host's
  loopback is not in its namespace.
`AUTORESEARCH_AGENT_HOSTS=*` is the user's explicit way back to the host's network (said as the agent starts).
"""

from __future__ import annotations

import os
import socket
import socketserver
import subprocess
import sys
import threading
from pathlib import Path

ENV = "AUTORESEARCH_AGENT_HOSTS"
RELAY_PORT = 3128        # inside the agent's network namespace: the relay's port (nothing else listens there)
SOCKET_NAME = "net.sock"
NET_DIR = "/tmp/autoresearch-net"  # inside an agent's sandbox: the directory of the proxy's socket
HEADER_LIMIT = 16 << 10  # bytes of a CONNECT request's head
HEAD_TIMEOUT = 30        # seconds a connection may take to send its request's head
CONNECTIONS = 64         # connections of one agent open at once: more are closed at once
REFUSED_KEPT = 100       # refused requests kept to name at the end
# The model APIs of the agents the harness has presets for, by the program's name (and what their login and
# updates need); any other command gets AUTORESEARCH_AGENT_HOSTS alone
HOSTS = {
    "claude": ("api.anthropic.com", "console.anthropic.com", "claude.ai", "statsig.anthropic.com"),
    "codex": ("api.openai.com", "chatgpt.com", "auth.openai.com"),
    "aider": ("api.anthropic.com", "api.openai.com", "openrouter.ai", "api.deepseek.com",
              "generativelanguage.googleapis.com"),
}


def allowlist(command: list[str]) -> tuple[str, ...] | None:
    """The hosts (host or host:port) the agent `command` may reach; None: the host's network, asked for by the
    user (AUTORESEARCH_AGENT_HOSTS=*)."""
    extra = [h.strip().lower() for h in os.environ.get(ENV, "").split(",") if h.strip()]
    if "*" in extra:
        return None
    name = Path(command[0]).name if command else ""
    return tuple(dict.fromkeys([*HOSTS.get(name, ()), *extra]))


def permitted(target: str, allowed: tuple[str, ...]) -> tuple[str, int] | None:
    """(host, port) of a CONNECT target on the allowlist, or None."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    host = host.strip("[]").lower()
    if f"{host}:{port}" in allowed or (port == "443" and host in allowed):
        return host, int(port)
    return None


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        if not self.server.slots.acquire(blocking=False):  # the agent's connections are bounded, the harness's fds
            return                                          # and threads with them
        try:
            self._handle()
        finally:
            self.server.slots.release()

    def _handle(self) -> None:
        self.request.settimeout(HEAD_TIMEOUT)  # a request head that never ends holds nothing for long
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < HEADER_LIMIT:
                chunk = self.request.recv(4096)
                if not chunk:
                    return
                head += chunk
        except OSError:
            return
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        target = permitted(parts[1], self.server.allowed) if len(parts) == 3 and parts[0] == "CONNECT" else None
        if target is None:
            if len(self.server.refused) < REFUSED_KEPT:  # the agent's text: shown as ascii() writes it, never raw
                self.server.refused.append(ascii(" ".join(parts[:2])[:200])[1:-1])
            self.request.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        try:
            upstream = socket.create_connection(target, timeout=30)
        except OSError:
            self.request.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")  # nothing of the host's
            return
        upstream.settimeout(None)
        self.request.settimeout(None)
        with upstream:
            self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            rest = head.split(b"\r\n\r\n", 1)[1]
            if rest:
                upstream.sendall(rest)
            splice(self.request, upstream)


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes (pump, the relay's own, each way)."""
    other = threading.Thread(target=pump, args=(b, a), daemon=True)
    other.start()
    pump(a, b)
    other.join(timeout=5)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class Proxy:
    """The proxy for one agent's sandbox, on a Unix socket in `directory` (made by the caller, bound into the
    sandbox at NET_DIR). `refused`: what the agent asked for and did not get."""

    def __init__(self, directory: Path, allowed: tuple[str, ...]):
        self.path = directory / SOCKET_NAME
        self.server = _Server(str(self.path), _Handler)
        self.server.allowed, self.server.refused = allowed, []
        self.server.slots = threading.BoundedSemaphore(CONNECTIONS)
        self.allowed, self.refused = allowed, self.server.refused
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)

    def describe(self) -> str:
        return (f"its own network: only {', '.join(self.allowed) or 'nothing'} reachable, through the harness's "
                f"proxy (more: {ENV}=host,host)")


# --- inside the agent's sandbox: the relay ---------------------------------------------------------------------

def pump(src, dst):
    try:
        while True:
            chunk = src.recv(1 << 16)
            if not chunk:
                break
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listener, path):
    while True:
        conn, _ = listener.accept()
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(path)
        except OSError:
            conn.close()
            continue
        threading.Thread(target=pump, args=(conn, upstream), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()


def relay():
    path, port, sep, command = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    if sep != "--" or not command:
        sys.exit("usage: netproxy.py SOCKET PORT -- COMMAND...")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=serve, args=(listener, path), daemon=True).start()
    try:
        proc = subprocess.Popen(command)
    except OSError as e:
        sys.exit(f"{command[0]}: {e.strerror}")
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            continue
    sys.stdout.flush()
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    relay()
