"""`eaglespec bench`: measure speedup, tau and acceptance of decoding methods side by side.

Layers: `datasets` (question sets), `methods` (one object per decoding method, timed the same way),
`metrics` (PURE functions of records), `harness` (interleaved runs and the losslessness check),
`report` (results.json, results.md, PNG plots), `cli` (the sub-command).
"""
