import sys
from eaglespec.engine.decoding import EagleGenerator
prompt = sys.argv[1] if len(sys.argv) > 1 else "Explain in a few sentences why the sky is blue."
g = EagleGenerator.from_pretrained(tree="chain:1", draft_floor=0.0)
tok = g.target.tokenizer
ids = g.encode(messages=[{"role": "user", "content": prompt}])
r = g.generate(input_ids=ids, max_new_tokens=84)
out = r.token_ids
pos, line, acc = 1, [], []  # out[0] is the prefill's token, in no step
for s in r.steps:
    if s.tree_size < 2 or s.emitted == 0:
        pos += s.emitted; continue
    # a step of the chain: its draft is for the token at pos (after the last step's bonus); accepted or not
    # (session 45's run started pos at 0 and so printed each step's token one position early)
    t = tok.decode([out[pos]]) if pos < len(out) else ""
    acc.append(s.accepted)
    line.append(("[" + t + "]") if s.accepted else ("<" + t + ">"))
    pos += s.emitted
print("".join(line))
print("depth-1 acceptance", sum(acc) / len(acc), "first 20:", sum(acc[:20]) / 20, "rest:", sum(acc[20:]) / max(1, len(acc[20:])))
