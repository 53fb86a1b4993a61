import json, torch
from eaglespec.draft.vocab import load_draft_vocab
from eaglespec.bench.datasets import load_questions
from eaglespec.engine.decoding import EagleGenerator
H = "src/eaglespec/heads/smollm2-135m-instruct-16k"
g = EagleGenerator.from_pretrained(tree=None, compile="off")
V = g.target.vocab_size
tops = {n: set(load_draft_vocab(H, n, V).tolist()) for n in (1024, 2048, 4096, 8192)}
for name, path, ds in (("mt-bench", "docs/data/bench-mt80-zen4-s39/results.json", "mt-bench"), ("tasks", "docs/data/bench-tasks-zen4-s35/results.json", "tasks")):
    recs = [r for r in json.load(open(path))["records"] if r["method"] == "vanilla"]
    qs = {str(q.question_id): q for q in load_questions(ds)}
    tot = 0; hit = {k: 0 for k in ("4096", "8192", "4096+prompt", "4096+prompt+seen", "2048+prompt+seen", "1024+prompt+seen", "8192+prompt+seen")}
    for r in recs:
        q = qs[str(r["question_id"])]
        prompt = set(g.encode(messages=[{"role": "user", "content": q.turns[0]}]))
        seen = set()
        for t in r["token_ids"]:
            tot += 1
            hit["4096"] += t in tops[4096]; hit["8192"] += t in tops[8192]
            hit["4096+prompt"] += t in tops[4096] or t in prompt
            hit["4096+prompt+seen"] += t in tops[4096] or t in prompt or t in seen
            for n in (1024, 2048, 8192):
                hit[f"{n}+prompt+seen"] += t in tops[n] or t in prompt or t in seen
            seen.add(t)
        extra = len((prompt) - tops[4096])
    print(name, tot, {k: round(v / tot, 4) for k, v in hit.items()})
