"""Heads in other engines' layouts: `eaglespec export` and `eaglespec import` (formats.py), the
GGUF that llama.cpp runs (llamacpp.py). docs/interop.md lists what each engine's loader reads."""
