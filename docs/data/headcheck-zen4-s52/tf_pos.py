# teacher-forced depth-1 top-1 of a head by position in the reply: make run's prompt + the first N MT-bench questions
# usage: EAGLESPEC_COMPILE=off python docs/data/headcheck-zen4-s52/tf_pos.py [HEAD] [N] (from the repository root)
import sys, torch
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.draft.drafter import Drafter
from eaglespec.core.config import parse_tree
from eaglespec.bench.datasets import load_questions, user_message
head = sys.argv[1] if len(sys.argv) > 1 else "default"
nq = int(sys.argv[2]) if len(sys.argv) > 2 else 20
g = EagleGenerator.from_pretrained(head=head, tree="chain:1", draft_floor=0.0)
qs = load_questions("mt-bench", nq)
prompts = ["Explain in a few sentences why the sky is blue."] + [user_message(q, 0, "mt-bench", True) for q in qs]
edges = [0, 5, 10, 20, 40, 80, 128]
tot = [[0, 0] for _ in edges[:-1]]
for i, p in enumerate(prompts):
    ids = g.encode(messages=[{"role": "user", "content": p}])
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if isinstance(ids[0], list): ids = ids[0]
    r = g.generate(input_ids=torch.tensor(ids), max_new_tokens=128)
    full = torch.tensor(ids + list(r.token_ids)); n = len(ids)
    with torch.no_grad():
        f = g.target.features(full[None])[0]
        d = Drafter(g.head, g.target, parse_tree("chain:1"), g.draft_vocab, 0.0, 0, g.context_vocab)
        state = d.new_state(1, len(full) + 16)
        out = d._absorb(state, [full[1:]], [f[:-1]])
        q, table = d._draft_logprobs(state, out)
        pred = d._to_target_ids(q.argmax(-1), table)[0]
    hits = [int(pred[t]) == int(full[t + 2]) for t in range(n - 1, len(full) - 2)]
    row = []
    for b in range(len(edges) - 1):
        h = hits[edges[b]:edges[b + 1]]
        if i > 0: tot[b][0] += sum(h); tot[b][1] += len(h)
        row.append(f"{sum(h)}/{len(h)}")
    print(f"{p[:28]!r:32}", " ".join(row), f"all {sum(hits)/len(hits):.3f}", flush=True)
print("MT-bench positions", " ".join(f"[{edges[b]},{edges[b+1]}) {t[0]/max(t[1],1):.3f} (n={t[1]})" for b, t in enumerate(tot)))
