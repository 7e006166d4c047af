"""A target reached over SSH, split by concern: `config` (~/.ssh/config and ProxyJump hops), `hostkeys`
(known_hosts: refuse, or pin under accept-new), `connect` (the authenticated connection through each hop),
`forward` (local ports tunnelled to the target) and `transport` (the agent's exec channel on it).

Importing this package imports nothing: paramiko is slow to import and only an SSH host's opening pays it.
"""
