# teacher-forced depth-1 top-1 of a head on the first N distilled records (held out in training): the reply regenerated
# now in fp32 and the stored one. usage: EAGLESPEC_COMPILE=off python docs/data/headcheck-zen4-s52/tf_heldout.py [HEAD] [N]
# (from the repository root; the records are docs/data/distill-4k's first chunk)
import sys, json, torch
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.draft.drafter import Drafter
from eaglespec.core.config import parse_tree
from eaglespec.train.distill import prompt_ids
g = EagleGenerator.from_pretrained(head=sys.argv[1] if len(sys.argv) > 1 else "default", tree="chain:1", draft_floor=0.0)
recs = [json.loads(l) for l in open("docs/data/distill-4k/chunk-00000.jsonl")][:int(sys.argv[2]) if len(sys.argv) > 2 else 10]
tot = [0, 0]; tot_data = [0, 0]
def tf(full, n):
    with torch.no_grad():
        f = g.target.features(full[None])[0]
        d = Drafter(g.head, g.target, parse_tree("chain:1"), g.draft_vocab, 0.0, 0, g.context_vocab)
        state = d.new_state(1, len(full) + 16)
        out = d._absorb(state, [full[1:]], [f[:-1]])
        q, table = d._draft_logprobs(state, out)
        pred = d._to_target_ids(q.argmax(-1), table)[0]
        tgt = g.target.lm_head(f).argmax(-1)  # the target's own next token at each position
    return [int(pred[t]) == int(tgt[t + 1]) for t in range(n - 1, len(full) - 2)]
for r in recs:
    msgs = r["messages"]; prompt = msgs[:-1]
    ids = prompt_ids(g.target.tokenizer, prompt)
    enc = g.encode(messages=prompt); enc = enc.tolist() if hasattr(enc, "tolist") else list(enc)
    if isinstance(enc[0], list): enc = enc[0]
    res = g.generate(input_ids=torch.tensor(ids), max_new_tokens=128)
    h = tf(torch.tensor(ids + list(res.token_ids)), len(ids))
    data_reply = g.target.tokenizer(msgs[-1]["content"], add_special_tokens=False)["input_ids"][:128]
    hd = tf(torch.tensor(ids + data_reply), len(ids))
    tot[0] += sum(h); tot[1] += len(h); tot_data[0] += sum(hd); tot_data[1] += len(hd)
    print(f"same prompt ids as encode: {ids == enc}; fp32 reply {sum(h)/len(h):.3f}; stored (bf16) reply {sum(hd)/max(len(hd),1):.3f}", flush=True)
print(f"held-out prompts: fp32 greedy replies {tot[0]/tot[1]:.3f} (n={tot[1]}), stored replies {tot_data[0]/tot_data[1]:.3f} (n={tot_data[1]})")
