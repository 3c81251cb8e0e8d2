"""The live `autoresearch dashboard` and `report --html FILE`: one page over the facts (facts.py).

The dashboard serves the facts (and each row's diff and log on demand) to a page that polls them; `report --html`
writes the same page with the facts and the plotting library inline, one file to share. The page only reads,
with one exception: its stop button writes .autoresearch/stop, which `autoresearch loop` reads between
experiments (and deletes when it starts), to stop after the experiment in flight.
"""

from __future__ import annotations

import errno
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from autoresearch import facts, state

PAGE = Path(__file__).with_name("dashboard.html")


class DashboardError(RuntimeError):
    pass


def plotly_js() -> str:
    """The plotting library, from its pip package (no network: the page loads it from the dashboard)."""
    import plotly
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    return path.read_text(encoding="utf-8")


def page(data: dict | None = None) -> str:
    """The dashboard page: live (data None: it polls /api/facts, loads /plotly.min.js) or static (the facts and
    the library inline)."""
    html = PAGE.read_text(encoding="utf-8")
    if data is None:
        return (html.replace("<!--PLOTLY-->", '<script src="/plotly.min.js"></script>')
                .replace("/*FACTS*/null", "null"))
    script = "<script>" + plotly_js().replace("</script", "<\\/script") + "</script>"
    facts_json = json.dumps(data).replace("<", "\\u003c")  # no `</script` nor `<!--` of a row's text in the page
    return html.replace("<!--PLOTLY-->", script).replace("/*FACTS*/null", facts_json)


# --- the live server ---------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    """One request to the dashboard; the server (a Server) holds the repository and the plotting library."""

    def log_message(self, *args):  # quiet: a poll every two seconds would fill the terminal
        pass

    def send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        repo, url = self.server.repo, urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            if url.path == "/":
                self.send(200, page().encode(), "text/html; charset=utf-8")
            elif url.path == "/plotly.min.js":
                self.send(200, self.server.library, "application/javascript")
            elif url.path == "/api/facts":
                body = json.dumps(facts.facts(state.results(repo), repo, query.get("tag"))).encode()
                self.send(200, body, "application/json")
            elif url.path == "/api/diff":
                self.send(200, facts.diff(repo, query.get("commit", "")).encode(), "text/plain; charset=utf-8")
            elif url.path == "/api/log":
                self.send(200, facts.log_tail(repo, query.get("run_id", "")).encode(), "text/plain; charset=utf-8")
            else:
                self.send(404, b"not found", "text/plain")
        except facts.BadQuery as e:
            self.send(400, str(e).encode(), "text/plain")

    def do_POST(self):
        if urlparse(self.path).path != "/api/stop":
            self.send(404, b"not found", "text/plain")
            return
        path = state.stop_file(self.server.repo)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + " from the dashboard\n")
        self.send(200, b'{"stop_requested": true}', "application/json")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, repo: Path, library: bytes):
        self.repo, self.library = repo, library
        super().__init__(address, Handler)


def serve(repo: Path, host: str = "127.0.0.1", port: int = 8080, log=print):
    """The dashboard's server, listening (the caller serves it until Ctrl-C). Raises DashboardError when the port
    is taken."""
    library = plotly_js().encode()  # read before listening: a missing file is its own error, not the port's
    try:
        server = Server((host, port), repo, library)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise DashboardError(f"port {port} on {host} is in use (another dashboard?): use --port N, e.g. "
                                 f"--port {port + 1}.") from None
        raise DashboardError(f"cannot listen on {host}:{port} ({e.strerror}).") from None
    bound = server.server_address[1]
    log(f"dashboard on http://{host}:{bound}/ (read-only; Ctrl-C stops it). From another machine: "
        f"ssh -L {bound}:localhost:{bound} THIS_HOST, then open http://localhost:{bound}/")
    return server
