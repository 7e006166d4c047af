"""A resident deployer, so that a command does not pay the interpreter's start and deployer's imports each time.

Most of a short command's time on a near target is start-up: Python, pydantic, paramiko, deployer's modules
(about 0.3 s of a 0.5 s apply on these machines). `deployer daemon start` leaves one process per user and
install that has imported all of it; a `deployer` command that finds it answering hands it its argv, working
directory, environment, umask and its stdin, stdout and stderr (the file descriptors themselves), and the daemon
forks the command from its imported state (Mercurial's chg, Gradle's daemon). The fork runs deployer's own
entry point, in its own process group, and its exit code, or the signal that ended it, becomes the command's.
Signals the command gets (Ctrl-C, Ctrl-Z, a TERM, a terminal resize) go on to the fork; a command killed
outright takes its fork with it, as if the fork had been the command.

What keeps this honest:
- One daemon per user and install (interpreter and deployer's package folder), at a socket in a folder only that
  user can enter (`$XDG_RUNTIME_DIR/deployer`, else `~/.cache/deployer/daemon`; DEPLOYER_DAEMON_DIR names
  another); each side checks the other's user id from the kernel (SO_PEERCRED).
- A daemon serves only the code it imported, and only callers that come from where it did: each command sends
  a stamp of its module path, interpreter flags and options, the PYTHON* settings modules read, and its process
  context (namespaces, cgroup, nice, CPUs, groups, limits: a fork would have the daemon's), then of deployer's
  files (size and mtime of each), the interpreter and the module path's folders' mtimes (which an install
  changes). Another caller is refused and the daemon stays; the same caller with newer code finds the daemon
  out of date, and it says so, stops listening and exits. Either way the command runs as if no daemon were there.
- Nothing is ever worse than without it: no daemon, a folder that is not this user's alone, a stale daemon or
  one that does not answer: the command runs in its own process, as it always did.
- It exits after a spell without commands (15 minutes unless told), and on `deployer daemon stop`; commands it
  started run on to their end either way.
DEPLOYER_DAEMON=off makes a command ignore any daemon; =auto makes a command that finds none start one for the
commands after it.
"""
