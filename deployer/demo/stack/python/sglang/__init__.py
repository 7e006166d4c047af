"""A tiny, CPU-only, standard-library imitation of SGLang's prefill/decode disaggregation.

It exists so that ``deployer`` can be demonstrated and tested end to end without GPUs: the
module layout mirrors upstream (``sglang/srt/disaggregation/{base,common,nixl}/conn.py``) so a
playbook's ``dest:`` paths are the real ones, and the KV-transfer status bookkeeping
reproduces the real "KVPoll terminal-sticky" bug. Environment knobs: see
``sglang.srt.demo_knobs``.
"""

__version__ = "0.0.0+demo"
