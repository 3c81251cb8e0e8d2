"""The harness's own evaluation of a finished run: val_bpb (and test_bpb) of the exported model.

The script side runs in a fresh process that never imports train.py: `python -I -B PRIVATE/evaluator/__main__.py`,
a copy of this package in a new private directory, with a clean copy of prepare.py taken from git beside it (so no
edited file and no forged bytecode can stand in for either). It loads the exported graph (JSON) and its tensors
(safetensors) with no pickle and no code from the run, allows only ATen operators and no state mutation, checks
that it reproduces train.py's own score on the fixed check rows, scores the validation rows, and checks that the
model is causal (later tokens never change an earlier position's scored log-probability), deeper for a run that
may be kept, whose test rows it also scores. It prints one JSON object.

One module a job, the script side first; they import one another relatively and nothing else of autoresearch,
so that the copy runs the same from any directory:
- safe_read: reading a file a run wrote (regular files of bounded size only; the harness reads with it too), and
  Refused and Broken, the two ways an evaluation ends without a score
- graph: the exported graph's schema, checked and rebuilt before torch's deserializer sees it; the exported
  program loaded from it and the safetensors (load_program)
- probes: the causality check (CausalProbes) and its tolerances
- scoring: what the harness asks (Request), check_bpb, val_bpb, test_bpb and the probes on one model (evaluate),
  and the script's body (main); __main__ runs it by path in the private copy
and the harness's side, never copied: harness (Evaluator, run_evaluation), which starts the script. Nothing the
training could reach feeds it (Evaluator says how, in each mode; docs/integrity.md, the threat model).
"""
