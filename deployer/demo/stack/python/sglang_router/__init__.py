"""A tiny imitation of the SGLang PD router (``python -m sglang_router.launch_router``)."""
