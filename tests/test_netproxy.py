"""The agent's proxy (autoresearch/netproxy.py): which CONNECT targets it opens, what it says of the rest, and
what an agent's connections may hold of the harness. Fast: no sandbox, a Unix socket in the test's directory."""

import socket

from autoresearch import netproxy


def test_only_the_allowlist_on_port_443_or_a_listed_port():
    allowed = netproxy.allowlist(["claude"])
    assert netproxy.permitted("api.anthropic.com:443", allowed) == ("api.anthropic.com", 443)
    assert netproxy.permitted("API.Anthropic.COM:443", allowed) == ("api.anthropic.com", 443)
    for target in ("api.anthropic.com:80", "api.anthropic.com.:443", "evil.com:443", "127.0.0.1:443",
                   "localhost:443", "[::1]:443", "api.anthropic.com", ":443", "api.anthropic.com:443x",
                   "user@api.anthropic.com:443", "2130706433:443"):
        assert netproxy.permitted(target, allowed) is None, target
    assert netproxy.permitted("127.0.0.1:8000", ("127.0.0.1:8000",)) == ("127.0.0.1", 8000)


def test_the_user_s_hosts_add_to_a_preset_and_star_is_the_host_s_network(monkeypatch):
    monkeypatch.setenv(netproxy.ENV, "models.example.org, 10.0.0.5:8443")
    assert netproxy.allowlist(["/home/me/.local/bin/codex"]) == (*netproxy.HOSTS["codex"], "models.example.org",
                                                                 "10.0.0.5:8443")
    assert netproxy.allowlist(["my-agent"]) == ("models.example.org", "10.0.0.5:8443")
    monkeypatch.setenv(netproxy.ENV, "*")
    assert netproxy.allowlist(["claude"]) is None


def ask(path, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall(request)
        return s.recv(4096)


def test_a_refused_request_is_named_as_ascii_and_the_agent_s_connections_are_bounded(tmp_path, monkeypatch):
    """The refused targets are printed to the user's terminal at the end: the agent's text, so an escape sequence in
    it is shown escaped. Connections beyond CONNECTIONS are closed at once: the agent cannot hold the harness's
    threads and descriptors."""
    from conftest import STALL_ROOM
    monkeypatch.setattr(netproxy, "HEAD_TIMEOUT", STALL_ROOM)  # the held slots stay held however slow the machine
    proxy = netproxy.Proxy(tmp_path, ())
    try:
        assert ask(proxy.path, b"CONNECT \x1b]0;pwned\x07evil:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
        assert ask(proxy.path, b"GET http://evil/ HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
        assert "\x1b" not in "".join(proxy.refused) and "\\x1b]0;pwned\\x07evil:443" in proxy.refused[0]
        held = []
        for _ in range(netproxy.CONNECTIONS):  # each holds a slot: its head never ends
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(proxy.path))
            held.append(s)
        import time
        deadline = time.monotonic() + 60  # until the proxy has taken every slot (however slow the machine is)
        while proxy.server.slots._value and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.server.slots._value == 0
        with socket.socket(socket.AF_UNIX) as extra:
            extra.settimeout(STALL_ROOM)
            extra.connect(str(proxy.path))
            try:
                extra.sendall(b"CONNECT evil:443 HTTP/1.1\r\n\r\n")
                answer = extra.recv(4096)
            except (ConnectionResetError, BrokenPipeError):  # closed before it wrote or read: the same
                answer = b""
            assert answer == b""  # closed without an answer
        for s in held:
            s.close()
    finally:
        proxy.close()
