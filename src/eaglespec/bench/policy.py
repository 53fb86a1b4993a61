"""`--tree auto`'s adaptive policy replayed offline: what a chain would accept at every position of
greedy decoding, and what any policy (window, first probe, confidence floor) would have earned.

`trace` decodes each prompt greedily, then feeds the head the target's states of the whole text
one position at a time, as decoding does after a step that accepted nothing, and drafts the
chain of the tuned tree's depth at every position: how many of its tokens the target's text
agrees with there, and the draft's confidence in each (the log of its path probability, what the
confidence floor reads). The head's view is the one decoding gives it; only the target's states
come from one forward over the whole text instead of step by step (equal within rounding).

`replay` runs the real `tuning.AdaptiveTree` over the traces with the machine's cached cost curve
(`--tree auto`'s own ladder: vanilla and the tuned chains) and prints each policy's predicted
speedup over vanilla per category. The cost curve leaves out some of a real step's Python and
cache misses, so a prediction is above what a benchmark measures; it ranks policies on the costs
the tuner plans with. Steps are judged as decoding judges them (tuning.AdaptiveTree.step_cost for
a step cut by the floor; a text's last step is not observed). What is replayed is the tuned trees'
static shapes (`bench --methods auto-static`): a lone sequence's EAGLE-2 growth of them (Drafter's
rerank, which `--tree auto` runs) picks each step's nodes from the draft's top-2 per level, which a
trace of chains does not hold.

    python -m eaglespec.bench.policy trace --dataset mt-bench --out runs/traces.jsonl
    python -m eaglespec.bench.policy replay runs/traces.jsonl --probe 16,64 --floor auto,0.1

docs/benchmarks.md, "The adaptive tree's first probe", is what these found first.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from ..draft.drafter import Drafter
from ..engine.tuning import AdaptiveTree


class _Recording(Drafter):
    """A drafter that keeps the path confidences of the last tree it drafted (its nodes in order)."""

    last_conf: list[float] = []

    def _floored(self, g, device, floor, levels):
        self.last_conf = list(g.conf[1:])
        return super()._floored(g, device, floor, levels)


def chain_of(depth: int):
    from ..core.tree import static_tree

    return static_tree([(0,) * d for d in range(1, depth + 1)])


@torch.no_grad()
def chains(gen, prompt: list[int], output: list[int], depth: int):
    """Yield, for each root position i of `output` but the last: the chain drafted there (its
    tokens after the root) and its path confidences."""
    target, head = gen.target, gen.head
    text = torch.tensor([prompt + output])
    features = target.forward_states(text, target.new_cache(), layers=head.hidden_layers).hidden[0]
    drafter = _Recording(head, target, chain_of(depth), gen.draft_vocab, context_vocab=gen.context_vocab)
    state = drafter.new_state(1, len(prompt) + len(output) + depth + 1)
    p = len(prompt)
    for i in range(len(output) - 1):
        r = p + i  # the root's index in the text; the head has seen pairs (x[t + 1], f[t]) up to it
        first = 1 if i == 0 else r  # the first draft takes the prompt's pairs too
        tree = drafter.draft(state, text[0, first:r + 1], features[first - 1:r], int(text[0, r]))
        yield tree.tokens[1:].tolist(), drafter.last_conf


def trace_text(gen, prompt: list[int], output: list[int], depth: int) -> list[list]:
    """-> per root position i of `output` (i < len - 1): [accepted, [conf at depths 1..depth]],
    the chain judged against output[i + 1:]."""
    steps = []
    for i, (tokens, conf) in enumerate(chains(gen, prompt, output, depth)):
        accepted = 0
        while accepted < len(tokens) and i + 1 + accepted < len(output) and output[i + 1 + accepted] == tokens[accepted]:
            accepted += 1
        steps.append([accepted, [round(c, 4) for c in conf]])
    return steps


def trace(gen, prompts: list[tuple[str, str, list[int]]], max_new_tokens: int, out: Path, depth: int,
          say=print) -> None:
    """prompts: (name, category, ids). Appends one JSON line a prompt to `out` (a rerun skips the
    names it holds)."""
    done = {json.loads(line)["name"] for line in out.read_text().splitlines()} if out.is_file() else set()
    for k, (name, category, ids) in enumerate(prompts):
        if name in done:
            continue
        output = gen.generate(input_ids=ids, max_new_tokens=max_new_tokens, speculative=False).token_ids
        steps = trace_text(gen, ids, output, depth)
        with out.open("a") as f:
            f.write(json.dumps({"name": name, "category": category, "tokens": len(output), "steps": steps}) + "\n")
        chain_tau = 1 + sum(s[0] for s in steps) / max(len(steps), 1)
        say(f"{k + 1}/{len(prompts)} {name}: {len(output)} tokens, the chain's tau per position {chain_tau:.2f}")


def chain_ladder(policy: AdaptiveTree) -> AdaptiveTree:
    """The policy with its ladder cut to vanilla and the chains (a trace knows chains only). A
    rung that is not a chain must never be the best choice at any acceptance scale, or the
    replay would not be the policy: refused."""
    is_chain = [tree is None or all(all(r == 0 for r in path) for path in tree.paths) for tree, *_ in policy.ladder]
    for scale in (0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.3, 1.6, 2.0, 3.0):
        speeds = [(1.0 + (tau - 1.0) * scale) / cost for _, tau, cost in policy.ladder]
        if not is_chain[max(range(len(speeds)), key=speeds.__getitem__)]:
            raise ValueError(f"a tree that is not a chain is the policy's best at acceptance scale {scale}: "
                             "a trace of chains cannot replay it")
    keep = [i for i, chain in enumerate(is_chain) if chain]
    start = keep.index(policy.start)
    return AdaptiveTree([policy.ladder[i] for i in keep], policy.vanilla, start, policy.window,
                        policy.probe_every, policy.max_probe_every, policy.level_cost)


def replay(record: dict, policy: AdaptiveTree, floor: float) -> tuple[float, float]:
    """One trace under one policy -> (predicted speedup over vanilla, tau)."""
    steps, n = record["steps"], record["tokens"]
    if n < 2:  # the prefill's token alone (an end of sequence at once): no step to replay
        return 1.0, 1.0
    log_floor = math.log(floor) if floor > 0 else -math.inf
    position, seconds, count = 1, 0.0, 0  # the first token is the prefill's
    while position < n:
        tree = policy.tree
        accepted, conf = steps[position - 1] if position - 1 < len(steps) else (0, [])
        if tree is None:
            emitted, verified = 1, 1
        else:
            kept = sum(1 for c in conf[:tree.num_nodes - 1] if c >= log_floor)
            verified = 1 + kept
            emitted = min(min(accepted, kept) + 1, n - position)
        cost = policy.step_cost(verified)
        seconds += cost if cost is not None else policy.ladder[policy.level][2]
        position += emitted
        count += 1
        if position < n:  # the last step is not evidence (decoding.new_batch)
            policy.observe(emitted, cost)
    return (n - 1) * policy.vanilla / seconds, (n - 1) / count


def table(records: list[dict], variants: dict[str, tuple[Callable[[], AdaptiveTree], float]]) -> list[str]:
    """variants: name -> (a fresh policy, floor). -> markdown rows: per set, tokens-weighted
    speedup / the worst prompt's."""
    sets = ["all"] + sorted({r["category"] for r in records})
    lines = ["| policy | " + " | ".join(sets) + " |", "|---|" + "---:|" * len(sets)]
    for name, (make, floor) in variants.items():
        per = defaultdict(list)
        for r in records:
            speedup, _ = replay(r, make(), floor)
            for key in ("all", r["category"]):
                per[key].append((speedup, r["tokens"]))
        cells = []
        for s in sets:
            tokens = sum(t for _, t in per[s])
            cells.append(f"{tokens / sum(t / sp for sp, t in per[s]):.3f} / {min(sp for sp, _ in per[s]):.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> int:
    from ..bench.datasets import add_dataset_arg, load_questions, user_message
    from ..cli.options import add_model_args, load_generator
    from ..errors import EagleError

    p = argparse.ArgumentParser(prog="python -m eaglespec.bench.policy", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trace", help="decode each prompt, drafting the chain at every position")
    add_dataset_arg(t)
    t.add_argument("--limit", type=int, default=None)
    t.add_argument("--max-new-tokens", type=int, default=256)
    t.add_argument("--depth", type=int, default=None, help="the chain's depth (default: the tuned tree's)")
    t.add_argument("--out", type=Path, required=True, help="JSON lines, one a prompt (a rerun continues)")
    r = sub.add_parser("replay", help="each policy's predicted speedup over the traces")
    r.add_argument("traces", type=Path, nargs="+")
    r.add_argument("--probe", default="16,64", help="vanilla steps before the first probe, comma-separated")
    r.add_argument("--window", default="8", help="steps between decisions, comma-separated")
    r.add_argument("--floor", default="auto", help="confidence floors: auto (the tuned one) or numbers")
    for q in (t, r):
        add_model_args(q)  # --tree auto (the default) is what is traced and replayed
    args = p.parse_args(argv)
    try:
        gen = load_generator(args)
        if gen.tuned is None:
            raise EagleError("no tuned tree (--tree auto, a head with acceptance.json, a tree that verifies exactly "
                             "here): nothing to trace or replay")
        if args.command == "trace":
            depth = args.depth or gen.tuned.tree.depth
            if not 1 <= depth <= 16:
                raise EagleError(f"--depth must be 1..16, got {depth}")
            source = Path(args.dataset).stem  # a packaged set's name, or a question file's
            prompts = [(f"{source}-{q.question_id}", f"{source}-{q.category}",
                        gen.encode(messages=[{"role": "user", "content": user_message(q, 0, args.dataset, True)}]))
                       for q in load_questions(args.dataset, args.limit)]
            args.out.parent.mkdir(parents=True, exist_ok=True)
            trace(gen, prompts, args.max_new_tokens, args.out, depth)
            return 0
        records = [rec for path in args.traces for rec in _load(path)]
        try:
            floors = [gen.floor_for(gen.tuned.tree) if f == "auto" else float(f) for f in args.floor.split(",")]
            probes, windows = [int(x) for x in args.probe.split(",")], [int(x) for x in args.window.split(",")]
        except ValueError as exc:
            raise EagleError(f"--probe, --window and --floor take comma-separated numbers ({exc})") from exc
        variants = {}
        for floor in floors:
            for probe in probes:
                for window in windows:
                    make = (lambda probe=probe, window=window: chain_ladder(
                        AdaptiveTree.from_tuned(gen.tuned, probe_every=probe, window=window)))
                    variants[f"window {window}, first probe after {probe}, floor {floor:g}"] = (make, floor)
        print("\n".join(table(records, variants)))
        print("(each cell: the set's predicted speedup over vanilla, tokens-weighted / its worst text's)")
        return 0
    except (EagleError, ValueError, OSError) as exc:  # OSError: a traces file that cannot be read
        print(f"error: {exc}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
