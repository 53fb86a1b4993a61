import torch, json
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.draft.drafter import Drafter
from eaglespec.core.config import parse_tree
from eaglespec.bench.datasets import load_questions, user_message
g = EagleGenerator.from_pretrained(tree="chain:1", draft_floor=0.0)
qs = load_questions("mt-bench", 6)
prompts = ["Explain in a few sentences why the sky is blue."] + [user_message(q, 0, "mt-bench", True) for q in qs]
tot = {}
for p in prompts:
    ids = g.encode(messages=[{"role": "user", "content": p}])
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if isinstance(ids[0], list): ids = ids[0]
    r = g.generate(input_ids=torch.tensor(ids), max_new_tokens=96)
    full = torch.tensor(ids + list(r.token_ids)); n = len(ids)
    with torch.no_grad():
        f = g.target.features(full[None])[0]
        for shift in (0, -1):
            d = Drafter(g.head, g.target, parse_tree("chain:1"), g.draft_vocab, 0.0, 0, g.context_vocab)
            state = d.new_state(1, len(full) + 16)
            feats = f[:-1] if shift == 0 else torch.cat([f[:1], f[:-2]])
            out = d._absorb(state, [full[1:]], [feats])
            q, table = d._draft_logprobs(state, out)
            pred = d._to_target_ids(q.argmax(-1), table)[0]
            hits = [int(pred[t]) == int(full[t + 2]) for t in range(n - 1, len(full) - 2)]
            tot.setdefault(shift, []).extend(hits)
            print(p[:30].replace("\n"," "), "shift", shift, round(sum(hits)/len(hits), 3), "first 20", round(sum(hits[:20])/20, 3))
for s, h in tot.items(): print("shift", s, "all", round(sum(h)/len(h), 3))
