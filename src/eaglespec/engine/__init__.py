"""The engine: the target adapter (target) over any Hugging Face causal LM, its KV caches
(kv_cache), the one decoding loop (batch) with its facade (decoding), tree tuning, numerics,
quantization, the compiled backend (compiled) and the prompt/text glue. The heads (eaglespec.draft)
are part of this layer. It imports the core and the base, never a job. See docs/architecture.md."""
