"""EAGLE heads timed side by side in one process, on the compiled path with --tree auto (each
head its own tuned tree, the adaptive policy on: what `eaglespec generate` gives a user), against
vanilla decoding: make run's prompt and MT-bench questions 3-12 (first turns), 256 new tokens
each. ROUNDS rounds (default 3), the order of vanilla and the heads rotating each round; the machine
held (background jobs paused); the cost curve measured again first. Prints each one's tokens/s,
tau and speedup over vanilla (ratio of the sums), the per-round ratios, and whether every output
equals vanilla's.

    python docs/data/distill-head-zen4-s50/ab_heads.py HEAD_A HEAD_B [HEAD_C ...] [ROUNDS]
"""
import sys, time

from eaglespec.bench.datasets import load_questions, user_message
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.pause import hold_machine

MAKE_RUN_PROMPT = "Explain in a few sentences why the sky is blue."
args = sys.argv[1:]
rounds = int(args.pop()) if args[-1].isdigit() else 3
heads = args

with hold_machine():
    gens = {h: EagleGenerator.from_pretrained(head=h, tree="auto", retune=i == 0) for i, h in enumerate(heads)}
    first = gens[heads[0]]
    qs = load_questions("mt-bench", 12)[2:12]
    messages = [[{"role": "user", "content": MAKE_RUN_PROMPT}]]
    messages += [[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}] for q in qs]
    prompts = [first.encode(messages=m) for m in messages]
    for h, g in gens.items():
        print(h, "|", g.tuned.tree.num_nodes - 1, "draft nodes,", g.compile_note)
        g.generate(input_ids=prompts[0], max_new_tokens=32)  # loads each one's graphs
    names = ["vanilla", *heads]
    stats = {n: {"wall": [], "tokens": 0, "forwards": 0, "out": [], "first": [0.0, 0, 0]} for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            g, speculative = (first, False) if n == "vanilla" else (gens[n], True)
            s, wall = stats[n], 0.0
            for k, ids in enumerate(prompts):
                t = time.perf_counter()
                out = g.generate(input_ids=ids, max_new_tokens=256, speculative=speculative)
                wall += time.perf_counter() - t
                if k == 0:  # make run's prompt: seconds, tokens, target forwards
                    s["first"] = [s["first"][0] + time.perf_counter() - t, s["first"][1] + len(out.token_ids),
                                  s["first"][2] + out.target_forwards]
                s["tokens"] += len(out.token_ids)
                s["forwards"] += out.target_forwards
                s["out"].append(out.token_ids)
            s["wall"].append(wall)
            print(f"round {r} {n}: {wall:.1f} s", flush=True)
    base = stats["vanilla"]
    for n in names:
        s = stats[n]
        ratios = " ".join(f"{b / w:.3f}" for b, w in zip(base["wall"], s["wall"]))
        print(f"{n}: {s['tokens'] / sum(s['wall']):.1f} tokens/s, tau {s['tokens'] / s['forwards']:.3f}, "
              f"speedup {sum(base['wall']) / sum(s['wall']):.3f}x (rounds {ratios}), "
              f"outputs equal to vanilla: {s['out'] == base['out']}")
    for h in heads[1:]:
        print(f"{h} / {heads[0]} tokens/s {sum(stats[heads[0]]['wall']) / sum(stats[h]['wall']):.3f}")
    for n in heads:
        w, tokens, forwards = stats[n]["first"]
        print(f"make run's prompt, {n}: speedup {base['first'][0] / w:.3f}x, tau {tokens / forwards:.3f}")
