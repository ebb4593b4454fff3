"""The GPU self-check, ``course selftest gpu`` (``make gpu-check``): docs/gpu-check.md."""
