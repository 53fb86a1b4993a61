"""The pure core: tree building (tree), acceptance (verify), sampling, attention masks and the
frozen configs (config). Plain tensor functions and dataclasses: no model state, no `transformers`,
no device assumptions; it imports nothing of ours outside the core but errors. See docs/architecture.md."""
