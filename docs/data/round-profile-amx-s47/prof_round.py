import cProfile, pstats, time
from eaglespec.pause import hold_machine
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions, user_message
with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    qs = load_questions("mt-bench", 8)[2:8]
    prompts = [g.encode(messages=[{"role": "user", "content": user_message(q, 0, "mt-bench", True)}]) for q in qs]
    g.generate(input_ids=prompts[0], max_new_tokens=32)
    pr = cProfile.Profile()
    steps = 0; tokens = 0
    t0 = time.perf_counter()
    pr.enable()
    for ids in prompts:
        r = g.generate(input_ids=ids, max_new_tokens=128)
        steps += len(r.steps); tokens += len(r.token_ids)
    pr.disable()
    wall = time.perf_counter() - t0
    print(f"rounds {steps} tokens {tokens} wall {wall:.2f} s  per round {wall/steps*1000:.2f} ms")
    st = pstats.Stats(pr); st.sort_stats("tottime"); st.sort_stats("cumulative").print_stats(45)
