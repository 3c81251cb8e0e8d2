"""The errors a user can act on: every command prints the message and exits 1 (cli.py)."""


class HarnessError(RuntimeError):
    """A problem the user can fix; the message says how."""


class Refused(HarnessError):
    """A run refused before it trained, and recorded as such."""


class MachineBusy(HarnessError):
    """Other processes kept the machine busy for longer than AUTORESEARCH_LOAD_WAIT: nothing ran."""
