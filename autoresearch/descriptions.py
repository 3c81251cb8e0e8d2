"""The grammar of a ledger row's description (results.tsv's `description` column): what the proposers, the harness
and the agents write there, and how the proposers and the reports read it back. Defined here once; every writer
and every reader imports it.

A description is a move, then the notes the harness appends:
- the move: `idea NAME: key=value, ...` (an idea of the catalog, ideas.py), followed by WHOLE_SITE when the idea
  rewrites a site no variant matched; `NAME old -> new, NAME2 old -> new` (hyperparameter constants: the
  built-in proposers); `baseline`, or `baseline (try N)` after the baseline crashed; `control for CONFIG: MOVE`
  (the tag's base run beside candidate CONFIG under the control rule, decide.py); `verify CHAMP: without KEEP
  (MOVE)`, `verify CHAMP: champion`, `verify CHAMP: transfer base|champion[ scaled NAME=VALUE]` (a verification's
  runs, status `verify`: verify.py); or anything an agent or a
  person wrote (on one line: run.py and driver.py fold its white space, `clean`);
- the notes: ` [run N]` (the N-th run of a series), ` [crash: REASON]`, ` [refused: REASON]`,
  ` [interrupted: REASON]` (record.py, run.py, driver.py), ` [agent ...]` (what the harness undid after an
  external agent, agents.py).
"""

from __future__ import annotations

import re

from autoresearch import sites

REPEAT_MARK = " [run "                   # a series' later runs: ` [run N]`
CRASH, REFUSED, INTERRUPTED = "crash", "refused", "interrupted"  # ` [KIND: REASON]`
AGENT_MARK = " [agent "                  # ` [agent ...]`: what the harness undid after an agent
HARNESS_NOTES = re.compile("|".join([re.escape(REPEAT_MARK) + r"\d+\]", re.escape(AGENT_MARK)]
                                    + [re.escape(f" [{kind}: ") for kind in (CRASH, REFUSED, INTERRUPTED)]))
BASELINE = "baseline"
WHOLE_SITE = " (rewrites its whole site)"  # a move on a site no variant matched: more changes than it names
IDEA_RE = re.compile(r"^idea (\w+): (.*)$")
CONTROL_RE = re.compile(r"^control for ([^\s:]+): ")  # a control run: the candidate configuration it is beside
CONSTANT_RE = re.compile(r"^([A-Z][A-Z0-9_]*) (.+?) -> (.+)$")  # the constant moves' "NAME old -> new"
# a verification's run: the champion it verifies, and what ran (verify.py)
VERIFY_RE = re.compile(r"^verify ([0-9a-f]{7}): (?:without ([0-9a-f]{7}) |(champion)|transfer (base|champion))"
                       r"(?: scaled (\S+))?")


# --- writing ----------------------------------------------------------------------------------------------------

def clean(text: str) -> str:
    """A description as the ledger keeps it: one line, its white space folded, never empty, and never in the
    harness's own grammar of a control run (quoted: an agent's `control for CONFIG: ...` would otherwise join
    another candidate's series), and nothing a terminal would act on (an escape sequence in an agent's text is
    printed by status, report and the loop: each character that is not printable becomes `?`)."""
    text = " ".join(text.split())
    text = "".join(c if c.isprintable() else "?" for c in text) or "(no description)"
    return f'"{text}"' if CONTROL_RE.match(text) else text


def printable(text: str) -> str:
    """Text a run wrote (its log, its errors) as the harness prints it to a terminal: lines and tabs kept, every
    other character that is not printable (an escape sequence's ESC, a BEL) as `?`."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


def repeated(description: str, run_no: int) -> str:
    """The description of a series' run_no-th run."""
    return f"{description}{REPEAT_MARK}{run_no}]"


def noted(description: str, kind: str, reason: str) -> str:
    """The description of a run that ended as `kind` (CRASH, REFUSED, INTERRUPTED), with why: one line, printable
    (a reason may quote what the run wrote: its export error, its log)."""
    return f"{description} [{kind}: {printable(' '.join(reason.split()))}]"


def agent_noted(description: str, notes: list[str]) -> str:
    """An agent's description with what the harness undid after it (`also edited x: reverted`)."""
    return description + "".join(f"{AGENT_MARK}{n}]" for n in notes)


def baseline(tries: int) -> str:
    """The baseline's description, after `tries` crashes of it."""
    return BASELINE if not tries else f"{BASELINE} (try {tries + 1})"


def control(config: str, description: str) -> str:
    """The description of a control run: the tag's base run beside candidate `config` (whose move was
    `description`) on the seed of its next pair (decide.py's control rule)."""
    return f"control for {config}: {move_text(description)}"


def verification(champion: str, kind: str, arm: str = "", move: str = "", scale: str = "") -> str:
    """The description of a verification's run of champion commit `champion`: kind ablate (the champion without
    keep `arm`, whose move was `move`), champion (the champion itself on a seed it lacks) or transfer (arm base
    or champion, at a longer budget, `scale` a constant's NAME=VALUE)."""
    text = {"ablate": f"without {arm[:7]} ({move_text(move)})", "champion": "champion",
            "transfer": f"transfer {arm}"}[kind]
    return f"verify {champion[:7]}: {text}" + (f" scaled {scale}" if scale else "")


def parse_verification(description: str) -> dict | None:
    """{champion, kind, arm, scale} of a description verification() wrote, else None."""
    m = VERIFY_RE.match(description)
    if not m:
        return None
    champ, keep, itself, arm, scale = m.groups()
    kind = "ablate" if keep else "champion" if itself else "transfer"
    return {"champion": champ, "kind": kind, "arm": keep or arm or "champion", "scale": scale or ""}


def assignments(params: dict) -> str:
    """`key=value, ...`, each value as Python writes it."""
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


def idea_text(name: str, params: dict) -> str:
    """An idea's move: `idea NAME: key=value, ...`."""
    return f"idea {name}: " + assignments(params)


def constants_text(changes) -> str:
    """A move of constants, from (name, old value, new value) triples: `NAME old -> new, ...`."""
    return ", ".join(f"{name} {old!r} -> {new!r}" for name, old, new in changes)


# --- reading ----------------------------------------------------------------------------------------------------

def base_description(description: str) -> str:
    """The description without a series' run number (and what follows it)."""
    return description.split(REPEAT_MARK)[0]


def move_text(description: str) -> str:
    """A row's description without what the harness appends to it (the repeat's mark, a crash's or refusal's
    reason, an agent's violations)."""
    return HARNESS_NOTES.split(description, 1)[0]


def control_of(description: str) -> str:
    """The candidate configuration a control run was beside, or "" for any other run."""
    m = CONTROL_RE.match(description)
    return m.group(1) if m else ""


def is_baseline(description: str) -> bool:
    return description.startswith(BASELINE)


def parse_idea(description: str) -> tuple[str, dict] | None:
    """(idea name, params) of a description written by idea_text() (harness notes after it are ignored), else
    None. Whether the catalog has such an idea is the caller's question (ideas.parse)."""
    m = IDEA_RE.match(move_text(description).removesuffix(WHOLE_SITE))
    if not m:
        return None
    params = {}
    for part in re.split(r", (?=\w+=)", m.group(2)):
        key, _, value = part.partition("=")
        params[key] = sites.literal(value)
        if params[key] is sites.NOT_A_VALUE:
            return None  # not a value idea_text() writes: a free-form description that only looks like one
    return m.group(1), params


def first_constant(text: str) -> tuple[str, str, str] | None:
    """(name, old, new) as written, of the first constant of a move written by constants_text(), else None."""
    m = CONSTANT_RE.match(re.split(r", (?=[A-Z][A-Z0-9_]* )", text)[0])
    return (m.group(1), m.group(2), m.group(3)) if m else None
