"""ztgate: a zero-trust gateway for self-hosted LLMs (Envoy + a Python ext_proc filter chain)."""
