# teacher-forced depth-1 top-1 (and top-4) of a head, binned by the target's own confidence in its greedy
# token (its top-1 probability): make run's prompt + the first N MT-bench questions, 128 new tokens
# usage: EAGLESPEC_COMPILE=off python docs/data/headcheck-zen4-s54/tf_conf.py [HEAD] [N] (from the repository root)
import sys, torch
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.draft.drafter import Drafter
from eaglespec.core.config import parse_tree
from eaglespec.bench.datasets import load_questions, user_message
head = sys.argv[1] if len(sys.argv) > 1 else "default"
nq = int(sys.argv[2]) if len(sys.argv) > 2 else 20
g = EagleGenerator.from_pretrained(head=head, tree="chain:1", draft_floor=0.0)
prompts = ["Explain in a few sentences why the sky is blue."] + [user_message(q, 0, "mt-bench", True) for q in load_questions("mt-bench", nq)]
encoded = [list(g.encode(messages=[{"role": "user", "content": p}])) for p in prompts]
replies = g.generate_batch(input_ids=encoded, max_new_tokens=128, speculative=False)
bins = [0, 0.3, 0.5, 0.8, 0.95, 1.01]
def table(rows):
    conf = torch.tensor([c for c, _, _ in rows]); top1 = torch.tensor([h for _, h, _ in rows]); top4 = torch.tensor([k for _, _, k in rows])
    out = []
    for lo, hi in zip(bins, bins[1:]):
        m = (conf >= lo) & (conf < hi)
        out.append(f"| [{lo:.2f}, {min(hi, 1):.2f}{')' if hi < 1 else ']'} | {int(m.sum())} ({m.float().mean():.0%}) | "
                   f"{top1[m].float().mean():.2f} | {top4[m].float().mean():.2f} |")
    out.append(f"| all | {len(rows)} | {top1.float().mean():.3f} | {top4.float().mean():.3f} |")
    return "\n".join(out)
sets = {"make run's reply": [], f"MT-bench, first {nq}": []}
for i, (ids, r) in enumerate(zip(encoded, replies)):
    full = torch.tensor(ids + list(r.token_ids)); n = len(ids)
    with torch.no_grad():
        f = g.target.features(full[None])[0]
        p = torch.softmax(g.target.lm_head(f).float(), -1).max(-1).values  # p[t]: confidence in token t+1
        d = Drafter(g.head, g.target, parse_tree("chain:1"), g.draft_vocab, 0.0, 0, g.context_vocab)
        state = d.new_state(1, len(full) + 16)
        q, table_ = d._draft_logprobs(state, d._absorb(state, [full[1:]], [f[:-1]]))
        top = d._to_target_ids(q.topk(4, -1).indices, table_)[0]  # [T, 4]: drafts for token t+2
    rows = [(float(p[t + 1]), int(top[t, 0]) == int(full[t + 2]), int(full[t + 2]) in top[t].tolist())
            for t in range(n - 1, len(full) - 2)]
    sets["make run's reply" if i == 0 else f"MT-bench, first {nq}"] += rows
for name, rows in sets.items():
    print(f"\n{name} ({head}): target's top-1 probability | positions | head top-1 | head top-4\n|---|---:|---:|---:|")
    print(table(rows), flush=True)
