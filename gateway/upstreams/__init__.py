"""Real demo/test upstreams: Triton (from nvidia-pytriton) and llama.cpp's server (xllamacpp)."""
