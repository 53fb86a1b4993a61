"""Where a `--tree auto` round's time goes now: cProfile over MT-bench questions 3-6 (128 new tokens,
the tuned tree fixed: adaptive off, so every round drafts and verifies it), after a warm-up, the
machine held. Prints tottime and cumtime leaders and the mean round."""
import cProfile, pstats, sys, time
from eaglespec.pause import hold_machine
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions, user_message

with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    g.adaptive = False
    qs = load_questions("mt-bench", 6)[2:6]
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs]
    g.generate(input_ids=prompts[0], max_new_tokens=32)
    pr = cProfile.Profile()
    rounds = tokens = 0
    t = time.perf_counter()
    pr.enable()
    for ids in prompts:
        r = g.generate(input_ids=ids, max_new_tokens=128)
        rounds += len(r.steps) - 1; tokens += len(r.token_ids) - 1
    pr.disable()
    wall = time.perf_counter() - t
    print(f"{rounds} rounds, {tokens} tokens, tau {tokens / rounds:.2f}, {1000 * wall / rounds:.2f} ms a round (profiled)")
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25); st.sort_stats("cumtime").print_stats(40)
