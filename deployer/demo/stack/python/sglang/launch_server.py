"""``python -m sglang.launch_server``: start a demo prefill or decode server.

Accepts the upstream command line; arguments that only matter on a GPU (``--base-gpu-id``,
``--tp-size``, ...) are accepted and ignored so that real start commands work unchanged.
Behaviour knobs come from the environment: see ``sglang.srt.demo_knobs``.
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    parser.add_argument("--model-path", default="demo-model")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--disaggregation-mode", choices=("prefill", "decode", "null"), default="null"
    )
    parser.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    parser.add_argument("--disaggregation-transfer-backend", default="nixl")
    parser.add_argument("--enable-metrics", action="store_true")
    # SGLang's flag: the time-to-first-token histogram's bucket bounds (default: SGLang's own).
    parser.add_argument("--bucket-time-to-first-token", type=float, nargs="+", default=None)
    # One server over several nodes: every rank runs this command, only rank 0 serves HTTP.
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--dist-init-addr", default=None)
    args, ignored = parser.parse_known_args(argv)
    if args.disaggregation_mode == "null":
        parser.error("the demo stack only runs with --disaggregation-mode prefill|decode")
    if args.nnodes > 1 and (args.dist_init_addr is None or not 0 <= args.node_rank < args.nnodes):
        parser.error("--nnodes > 1 needs --dist-init-addr HOST:PORT and 0 <= --node-rank < --nnodes")
    args.ignored_args = ignored
    return args


def main(argv: list[str] | None = None) -> int:
    from sglang.srt.entrypoints.http_server import launch_server

    return launch_server(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
