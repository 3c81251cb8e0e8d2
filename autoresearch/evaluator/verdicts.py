"""The two ways an evaluation ends without a score: the model breaks a rule, or there is no usable model."""


class Refused(Exception):
    """The model breaks a rule (reads the future, mutates state, runs non-ATen code)."""


class Broken(Exception):
    """The run left no usable model (the export is missing, unreadable or does not run)."""
