"""What this build itself does to the demo's latency: every generation's waits are ``SLOWDOWN`` longer (0.5: 50%
slower), on top of ``SGLANG_DEMO_SLOWDOWN``. A file of the build, read when the server starts, so a fix that
ships a changed one ships a latency regression with it (``deployer demo --fleet --regression``'s does)."""

SLOWDOWN = 0.0
