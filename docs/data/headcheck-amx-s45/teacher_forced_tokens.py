import sys, torch
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.draft.drafter import Drafter
prompt = sys.argv[1] if len(sys.argv) > 1 else "Explain in a few sentences why the sky is blue."
g = EagleGenerator.from_pretrained(tree="chain:1", draft_floor=0.0)
tok = g.target.tokenizer
ids = g.encode(messages=[{"role": "user", "content": prompt}])
ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
if isinstance(ids[0], list): ids = ids[0]
r = g.generate(input_ids=torch.tensor(ids), max_new_tokens=84)
full = torch.tensor(ids + list(r.token_ids))
n = len(ids)
with torch.no_grad():
    f = g.target.features(full[None])[0]
    from eaglespec.core.config import parse_tree
    d = Drafter(g.head, g.target, parse_tree("chain:1"), g.draft_vocab, 0.0, 0, g.context_vocab)
    state = d.new_state(1, len(full) + 16)
    out = d._absorb(state, [full[1:]], [f[:-1]])
    q, table = d._draft_logprobs(state, out)
    pred = d._to_target_ids(q.argmax(-1), table)[0]
hits = []
line = []
for t in range(n - 1, len(full) - 2):  # pair t predicts token t+2; reply tokens are full[n:]
    ok = int(pred[t]) == int(full[t + 2])
    hits.append(ok)
    line.append(("[" if ok else "<") + tok.decode([int(full[t + 2])]) + ("]" if ok else "|" + tok.decode([int(pred[t])]) + ">"))
print("".join(line[:40]))
print("teacher-forced depth-1:", sum(hits) / len(hits), "first 20:", sum(hits[:20]) / 20)
print("prompt:", repr(tok.decode(ids)))
