"""The errors a user can act on: every command prints the message and exits 1 (cli.py)."""


class HarnessError(RuntimeError):
    """A problem the user can fix; the message says how."""


class Refused(HarnessError):
    """A run refused before it trained, and recorded as such."""


class MachineBusy(HarnessError):
    """Other processes kept the machine busy for longer than AUTORESEARCH_LOAD_WAIT: nothing ran."""


class AgentError(RuntimeError):
    """The agent cannot run or made no change (agents.py). Here, not there, so that every command can catch it
    without importing agents.py and, through it, the proposer's optuna and scipy (0.5 s of every command)."""
