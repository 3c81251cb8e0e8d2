"""autoresearch: the experiment harness around prepare.py (fixed) and train.py (edited by the agent)."""

__version__ = "0.1.0"
