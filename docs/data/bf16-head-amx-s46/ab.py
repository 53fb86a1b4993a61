"""The draft head in fp32 against bf16 (`--draft-dtype`) on the compiled path, in one process:
--tree auto's tree, adaptive policy off, MT-bench questions 3-8 (first turns), 128 new tokens
each, the two alternating in ROUNDS rounds (default 4); the machine held (background jobs paused).
Prints tokens/s, tau (tokens per target forward, the prefill's token counted) and the median
drafting time a round (Drafter.draft_rows) of each, and whether their outputs are equal.

    python docs/data/bf16-head-amx-s46/ab.py [ROUNDS]
"""
import statistics, sys, time

from eaglespec.bench.datasets import load_questions, user_message
from eaglespec.draft import drafter as dr
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.pause import hold_machine

draft_s = []
draft_rows = dr.Drafter.draft_rows
def timed(*a, **k):
    t = time.perf_counter(); out = draft_rows(*a, **k); draft_s.append(time.perf_counter() - t); return out
dr.Drafter.draft_rows = timed

with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    g.adaptive = False
    qs = load_questions("mt-bench", 8)[2:8]
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs]
    print(g.draft_dtype_note, "|", g.tuned.tree.num_nodes, "nodes")
    for dtype in ("float32", "bfloat16"):  # builds or loads each one's head graphs
        g.use_draft_dtype(dtype)
        g.generate(input_ids=prompts[0], max_new_tokens=32)
    stats = {d: {"wall": 0.0, "tokens": 0, "forwards": 0, "draft": [], "out": []} for d in ("float32", "bfloat16")}
    for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
        for dtype in (("float32", "bfloat16") if rnd % 2 == 0 else ("bfloat16", "float32")):
            g.use_draft_dtype(dtype)
            s = stats[dtype]
            for ids in prompts:
                draft_s.clear()
                t = time.perf_counter()
                r = g.generate(input_ids=ids, max_new_tokens=128)
                s["wall"] += time.perf_counter() - t
                s["tokens"] += len(r.token_ids)
                s["forwards"] += r.target_forwards
                s["draft"] += draft_s
                s["out"].append(r.token_ids)
    for d, s in stats.items():
        print(f"{d}: {s['tokens'] / s['wall']:.1f} tokens/s, tau {s['tokens'] / s['forwards']:.3f}, "
              f"drafting median {1e3 * statistics.median(s['draft']):.2f} ms a round, {len(s['draft'])} rounds")
    f32, b16 = stats["float32"], stats["bfloat16"]
    print(f"bf16/fp32 tokens/s {(b16['tokens'] / b16['wall']) / (f32['tokens'] / f32['wall']):.3f}; "
          f"outputs equal: {f32['out'] == b16['out']}")
