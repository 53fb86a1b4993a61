import time, statistics, torch
from eaglespec.pause import hold_machine
from eaglespec.engine import compiled as C
from eaglespec.engine.decoding import EagleGenerator
from eaglespec.bench.datasets import load_questions

class Prefill(torch.nn.Module):
    def __init__(self, target, lm_head):
        super().__init__(); self.decoder, self.lm_head = target.decoder, lm_head
    def forward(self, input_ids, mask, positions, slots, keys, values, last):
        out = self.decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                           cache=C._SlotWriter(keys, values, slots), use_cache=True)
        f = out.last_hidden_state
        return f, self.lm_head(f.index_select(1, last)).float()

torch.set_grad_enabled(False)
with hold_machine():
    g = EagleGenerator.from_pretrained(tree="auto")
    t = g.target
    steps = C.CompiledSteps(t, folder=None)
    mod = Prefill(t, steps._lm_head()).eval()
    cfg = t.decoder.config
    def run(ids, q):
        rows = C.StaticRows.empty(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads, 1, t.dtype, t.device, 512)
        n = len(ids); fs = []; logits = None
        for s in range(0, n, q):
            chunk = torch.tensor(ids[s:s + q])[None]; m = chunk.shape[1]
            block = torch.ones(1, m, m, dtype=torch.bool).tril()
            mask, slots = C._step_inputs(rows, 1, m, q, s, block, t.dtype, t.device)
            args = (C._padded(chunk, 1, q), mask, C._padded(torch.arange(s, s + m)[None], 1, q), slots, rows.keys, rows.values, torch.tensor([m - 1]))
            f, logits = steps._runner((1, q, rows.capacity, f"proto{q}"), args, mod)(*args)
            rows._length = s + m; rows.lens[0] = s + m
            fs.append(f[:, :m])
        return torch.cat(fs, 1), logits
    prompts = [g.encode(messages=[{"role": "user", "content": qq.turns[0]}]) for qq in load_questions("mt-bench", 12)[2:]]
    t0 = time.perf_counter(); run(prompts[0], 16); run(prompts[0], 64); print("compiled both in", time.perf_counter() - t0, flush=True)
    ref = {}
    for name, fn in (("eager", lambda ids: t.forward_states(torch.tensor(ids)[None], t.new_cache())), ("c16", lambda ids: run(ids, 16)), ("c64", lambda ids: run(ids, 64))):
        ts = []
        for rep in range(3):
            for ids in prompts:
                a = time.perf_counter(); out = fn(ids); ts.append(time.perf_counter() - a)
                if rep == 0: ref.setdefault(name, []).append(out)
        print(name, "mean %.1f ms" % (sum(ts) / len(ts) * 1e3), flush=True)
    print("lens", [len(p) for p in prompts])
    for i in range(len(prompts)):
        e = ref["eager"][i].features; el = t.logits(e[0, -1:])
        for name in ("c16", "c64"):
            f, lg = ref[name][i]
            print(i, name, "feat maxdiff %.2e" % (f - e).abs().max().item(), "argmax same", bool(lg.argmax(-1) == el.argmax(-1)))
