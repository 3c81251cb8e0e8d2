"""Inside an agent's sandbox (netproxy.py): listen on 127.0.0.1:PORT of its own network namespace, hand every
connection to the harness's proxy on a Unix socket, run the agent, and end with it. Standard library only: it runs
as `python -I netrelay.py SOCKET PORT -- COMMAND...`, before anything of the agent's."""

import os
import socket
import subprocess
import sys
import threading


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


def main():
    path, port, sep, command = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    if sep != "--" or not command:
        sys.exit("usage: netrelay.py SOCKET PORT -- COMMAND...")
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
    main()
