"""The evaluator script's entry, run by its path in the private copy of this package (harness.Evaluator):
`python -I -B PRIVATE/evaluator/__main__.py --prepare-dir PRIVATE/fixed ...`. -I puts no script directory on
sys.path, so the directory that holds the copy is put there from this file's own path: the script's code is that
copy, the clean prepare.py beside it and the installed packages, never a work tree's. (`python -m
autoresearch.evaluator` runs the same script from the package itself.)"""

import importlib
import os
import sys

if __name__ == "__main__":
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # die with the harness or worker that started it
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no other non-root process of this uid may ptrace it
    if __package__:  # python -m autoresearch.evaluator
        script = importlib.import_module(__package__ + ".scoring")
    else:  # by its path: the package is the directory this file is in
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.dirname(here))
        script = importlib.import_module(os.path.basename(here) + ".scoring")
    code = script.main(sys.argv[1:])
    sys.stdout.flush()  # the harness waits for this process to end: skip torch's teardown (~0.9 s on 2 cores)
    sys.stderr.flush()
    os._exit(code)
