"""One-off: for each prompt, greedy decoding one token a step while the 3-node chain is drafted (and
dropped) at every position: what the chain would accept there and its path confidences. Offline, any
adaptive policy can then be replayed on these traces (simulate.py). Resumes: one JSON line a prompt."""
import json, sys, time
from pathlib import Path
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.engine.batch import Batch
from eaglespec.draft.drafter import Drafter
from eaglespec.bench.datasets import load_questions

out_path = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/policy/traces.jsonl")  # gzip it for simulate.py
gen = EagleGenerator.from_pretrained(tree="chain:3", draft_floor=0.0)
last = {}
orig_floored = Drafter._floored
def floored(self, g, device, floor):
    last["conf"] = list(g.conf)
    return orig_floored(self, g, device, floor)
Drafter._floored = floored
orig_trees = Batch._draft_trees
rec = []
def draft_trees(self, drafter):
    trees = orig_trees(self, drafter)
    s = self.sequences[0]
    rec.append((s.produced, trees[0].tokens.tolist(), last.get("conf", [])))
    return [self._root_only(x) for x in self.sequences]
Batch._draft_trees = draft_trees

prompts = [("make-run", "make-run", "Explain in a few sentences why the sky is blue.")]
prompts += [(f"mt-{q.question_id}", "mt-" + q.category, q.turns[0]) for q in load_questions("mt-bench")]
prompts += [(f"task-{q.question_id}", "task-" + q.category, q.turns[0]) for q in load_questions("tasks")]
done = {json.loads(l)["name"] for l in out_path.read_text().splitlines()} if out_path.exists() else set()
began = time.time()
for k, (name, cat, text) in enumerate(prompts):
    if name in done:
        continue
    rec.clear()
    ids = gen.encode(messages=[{"role": "user", "content": text}])
    r = gen.generate(input_ids=ids, max_new_tokens=256)
    out = r.token_ids
    steps = []
    for produced, tokens, conf in rec:
        chain = tokens[1:]
        acc = 0
        for j, t in enumerate(chain):
            if produced + j < len(out) and out[produced + j] == t:
                acc += 1
            else:
                break
        steps.append([produced, acc, [round(c, 4) for c in conf[1:]]])
    with out_path.open("a") as f:
        f.write(json.dumps({"name": name, "category": cat, "tokens": len(out), "steps": steps}) + "\n")
    print(f"{k + 1}/{len(prompts)} {name}: {len(out)} tokens, chain tau if fixed ~ {1 + sum(s[1] for s in steps) / max(len(steps), 1):.2f} per position, {time.time() - began:.0f} s", flush=True)
json.dump({"vanilla": gen.tuned.vanilla if gen.tuned else None}, sys.stdout)
