"""One-off: transparent huge pages (THP_MEM_ALLOC_ENABLE=1) paired against none, two worker processes
taking turns (a round each, alternately), so both see the same minutes of a machine whose speed wanders."""
import os, subprocess, sys, json, statistics, random
if len(sys.argv) > 1 and sys.argv[1] == "worker":
    import time
    from eaglespec.engine.decoding import EagleGenerator
    from eaglespec.bench.datasets import load_questions
    gen = EagleGenerator.from_pretrained(tree="chain:3")
    prompts = [gen.encode(messages=[{"role": "user", "content": q.turns[0]}]) for q in load_questions("mt-bench", 8)]
    gen.generate(input_ids=prompts[0], max_new_tokens=8)
    huge = [l.split()[1] for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages")][0]
    print(json.dumps({"ready": True, "huge_kb": int(huge)}), flush=True)
    for line in sys.stdin:
        i = int(line)
        out = {}
        for mode in ("vanilla", "eagle"):
            r = gen.generate(input_ids=prompts[i % len(prompts)], max_new_tokens=64, speculative=mode == "eagle")
            out[mode] = len(r.token_ids) / r.elapsed
        print(json.dumps(out), flush=True)
    sys.exit(0)
env0 = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
workers = {"4k": subprocess.Popen([sys.executable, __file__, "worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env0),
           "thp": subprocess.Popen([sys.executable, __file__, "worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**env0, "THP_MEM_ALLOC_ENABLE": "1"})}
for name, w in workers.items():
    print(name, w.stdout.readline().strip(), flush=True)
res = {n: {"vanilla": [], "eagle": []} for n in workers}
rounds = int(os.environ.get("ROUNDS", "16"))
for i in range(rounds):
    order = list(workers); random.Random(i).shuffle(order)
    for name in order:
        w = workers[name]; w.stdin.write(f"{i}\n"); w.stdin.flush()
        out = json.loads(w.stdout.readline())
        for k, v in out.items(): res[name][k].append(v)
    print(i, {n: {k: round(v[-1], 1) for k, v in r.items()} for n, r in res.items()}, flush=True)
for w in workers.values(): w.stdin.close(); w.wait()
for mode in ("vanilla", "eagle"):
    ratios = [b / a for a, b in zip(res["4k"][mode], res["thp"][mode])]
    print(f"{mode}: 4k pages {statistics.median(res['4k'][mode]):.1f} tok/s, THP {statistics.median(res['thp'][mode]):.1f} tok/s, "
          f"paired ratio THP/4k median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, THP faster in {sum(r > 1 for r in ratios)}/{len(ratios)})")
for n in workers:
    sp = [e / v for v, e in zip(res[n]["vanilla"], res[n]["eagle"])]
    print(f"{n}: EAGLE over vanilla median {statistics.median(sp):.3f}")
