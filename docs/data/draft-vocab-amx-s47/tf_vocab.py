"""Depth-1 top-1 of the shipped head, teacher-forced over the target's own greedy replies, with
the draft vocabulary at several sizes (each with the context tokens) and the whole vocabulary."""
import torch
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.draft.drafter import Drafter
from eaglespec.draft.vocab import load_draft_vocab
from eaglespec.core.config import parse_tree
from eaglespec.bench.datasets import load_questions, user_message
torch.set_num_threads(1)
g = EagleGenerator.from_pretrained(tree="chain:1", draft_floor=0.0, compile="off")
head_dir = g.head_dir
qs = load_questions("mt-bench", 12)
prompts = ["Explain in a few sentences why the sky is blue."] + [user_message(q, 0, "mt-bench", True) for q in qs]
sizes = [4096, 8192, 16384, None]
vocabs = {s: load_draft_vocab(head_dir, s, g.target.vocab_size) for s in sizes}
tot = {s: [] for s in sizes}
for p in prompts:
    ids = g.encode(messages=[{"role": "user", "content": p}])
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if isinstance(ids[0], list): ids = ids[0]
    r = g.generate(input_ids=torch.tensor(ids), max_new_tokens=128)
    full = torch.tensor(ids + list(r.token_ids)); n = len(ids)
    row = []
    with torch.no_grad():
        f = g.target.features(full[None])[0]
        for s in sizes:
            d = Drafter(g.head, g.target, parse_tree("chain:1"), vocabs[s], 0.0, 0, g.context_vocab and vocabs[s] is not None)
            state = d.new_state(1, len(full) + 16)
            out = d._absorb(state, [full[1:]], [f[:-1]])
            q, table = d._draft_logprobs(state, out)
            pred = d._to_target_ids(q.argmax(-1), table)[0]
            hits = [int(pred[t]) == int(full[t + 2]) for t in range(n - 1, len(full) - 2)]
            tot[s].extend(hits)
            row.append(f"{s}: {sum(hits)/len(hits):.3f}")
    print(p[:30].replace("\n", " "), len(full) - n, " ".join(row), flush=True)
print("all", " ".join(f"{s}: {sum(h)/len(h):.3f}" for s, h in tot.items()))
