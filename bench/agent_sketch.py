"""The bench sequence as the agent would run it: one connection, one exec, four batches.

Not deployer: a sketch of the phases issue 10 asks for (preflight, upload + remote compile +
numstat, commit, release), so bench_rtt.py can show what the agent alone costs before the
engine uses it. Run as its own process (it pays interpreter start-up and imports, as
`deployer apply` does):

    python bench/agent_sketch.py PORT USER IDENTITY_FILE KNOWN_HOSTS REPO FIX_DIR MESSAGE DEST...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from paramiko_ssh import connect, session

from deployer.agent.client import AgentClient, bootstrap_command
from deployer.agent.protocol import Put, Request, Run, Stat
from deployer.transport.pipes import ChannelPipe

COMPILE = "import sys\nfor f in sys.argv[1:]:\n    compile(open(f, 'rb').read(), f, 'exec')\n"


def main(port: str, user: str, identity: str, known_hosts: str, repo: str, fix_dir: str, message: str,
         *dests: str) -> None:
    files = {dest: (Path(fix_dir) / Path(dest).name).read_bytes() for dest in dests}
    for dest, data in files.items():
        compile(data, dest, "exec", dont_inherit=True)  # local_compile
    ssh = connect(port, user, identity, known_hosts)
    try:
        chan = session(ssh)
        chan.exec_command(bootstrap_command(sys.executable))
        with AgentClient(ChannelPipe(chan), name="sketch").start() as agent:
            paths = [f"{repo}/{dest}" for dest in dests]
            phases: list[list[Request[Any]]] = [
                [Run(["git", "rev-parse", "--git-dir", "HEAD"], cwd=repo), Stat(paths),
                 Run(["git", "status", "--porcelain", "-z", "--", *dests], cwd=repo)],
                [*(Put(path, data) for path, data in zip(paths, files.values(), strict=True)),
                 Run([sys.executable, "-c", COMPILE, *dests], cwd=repo),
                 Run(["git", "diff", "--numstat", "--", *dests], cwd=repo)],
                [Run(["git", "commit", "-q", "-m", message, "--", *dests], cwd=repo),
                 Run(["git", "rev-parse", "HEAD"], cwd=repo)],
                [Run(["true"])],  # release the lock
            ]
            for phase in phases:
                reply = agent.batch(phase)
                if not reply.ok:
                    raise SystemExit(f"phase failed at {reply.failed}: {reply.results[-1]}")
    finally:
        ssh.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
