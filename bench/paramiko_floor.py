"""The floor issue 23's targets are written against: one paramiko connection, ONE exec, the files as a tar on stdin.

bench_rtt.py hands it the floor's line (scratch_target.floor_line) and, on this process's stdin, the tar
(scratch_target.fix_tar), as it hands them to OpenSSH's `ssh` for the OpenSSH floor row. It compiles the files
here, in-process (what `python -m py_compile` does), then connects, runs the line with the tar on its stdin,
waits for the exit status and fails unless it is 0. Run as its own process (it pays interpreter start-up and
the paramiko import, as `deployer apply` does):

    python bench/paramiko_floor.py PORT USER IDENTITY_FILE KNOWN_HOSTS COMMAND FILE... < TAR
"""

from __future__ import annotations

import py_compile
import sys

from paramiko_ssh import connect, session


def main(port: str, user: str, identity: str, known_hosts: str, command: str, *files: str) -> None:
    for path in files:
        py_compile.compile(path, doraise=True)  # local_compile
    tar = sys.stdin.buffer.read()
    ssh = connect(port, user, identity, known_hosts)
    try:
        chan = session(ssh)
        chan.exec_command(command)
        chan.sendall(tar)
        chan.shutdown_write()
        out, err = chan.makefile("rb").read(), chan.makefile_stderr("rb").read()
        if (status := chan.recv_exit_status()) != 0:
            raise SystemExit(f"the floor's exec exited {status}:\n{out.decode(errors='replace')}"
                             f"{err.decode(errors='replace')}")
    finally:
        ssh.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
