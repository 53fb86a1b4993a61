"""StaticRows.select before and after session 51 (the whole buffers copied twice whenever a row
leaves, against only the slots in use, in place while the rows bucket stays), side by side in one
process: B MT-bench first turns decoded together by generate_batch (vanilla, compiled, 128 new
tokens; B = argv[1], default 16), ROUNDS rounds (argv[2], default 3), the two alternating, order
rotating; the machine held. Prints each round's seconds, the ratio of the sums, and whether the
outputs are equal.

    python docs/data/round-profile-zen4-s51/ab_select.py [B] [ROUNDS]
"""
import sys, time
import torch
from eaglespec.bench.datasets import load_questions, user_message
from eaglespec.engine import compiled
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.pause import hold_machine


def old_select(self, rows):  # the code before session 51
    index = torch.tensor(rows, dtype=torch.long)
    self.lens = self.lens[index]
    b = compiled.bucket(max(len(rows), 1), compiled.BATCH_BUCKETS)
    self._hold(compiled._sized(self.kv.index_select(1, index.to(self.kv.device)), b, self.capacity))
    self._length = int(self.lens.max()) if rows else 0


def old_reserve(self, slots, rows):
    cap, b = self.capacity, self.kv.shape[1]
    want_s, want_b = max(cap, compiled.bucket(slots, compiled.CACHE_BUCKETS)), max(b, compiled.bucket(rows, compiled.BATCH_BUCKETS))
    if (want_s, want_b) != (cap, b):
        self._hold(compiled._sized(self.kv, want_b, want_s))


B = int(sys.argv[1]) if len(sys.argv) > 1 else 16
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
variants = {"new": (compiled.StaticRows.select, compiled.StaticRows.reserve), "old": (old_select, old_reserve)}
with hold_machine():
    g = EagleGenerator.from_pretrained(head=None)
    qs = load_questions("mt-bench", B)
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs]
    g.generate_batch(input_ids=prompts, max_new_tokens=8)  # loads the graphs
    wall = {n: [] for n in variants}
    outs = {n: None for n in variants}
    names = list(variants)
    for r in range(ROUNDS):
        for n in (names if r % 2 == 0 else names[::-1]):
            compiled.StaticRows.select, compiled.StaticRows.reserve = variants[n]
            t = time.perf_counter()
            rs = g.generate_batch(input_ids=prompts, max_new_tokens=128)
            wall[n].append(time.perf_counter() - t)
            ids = [x.token_ids for x in rs]
            assert outs[n] is None or outs[n] == ids
            outs[n] = ids
            print(f"round {r} {n}: {wall[n][-1]:.2f} s, {sum(map(len, ids))} tokens", flush=True)
    print(f"old / new time: {sum(wall['old']) / sum(wall['new']):.3f} (rounds "
          + " ".join(f"{o / w:.3f}" for o, w in zip(wall["old"], wall["new"])) + f"); outputs equal: {outs['old'] == outs['new']}")
