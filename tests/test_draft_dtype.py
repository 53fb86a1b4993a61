"""The draft head in another dtype than the target's (--draft-dtype): when auto picks bf16, that a
bf16 head changes no output (greedy and reproducible sampling, with a reduced vocabulary and its
context tokens), and that its cost curve is keyed apart."""

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_target
from test_decoding import PROMPT, assert_same_or_tie, random_head

from eaglespec.engine import decoding
from eaglespec.engine.decoding import EagleGenerator, draft_dtype_for
from eaglespec.errors import EagleError


def fake_target(device="cpu", dtype=torch.float32, compiled=True):
    return SimpleNamespace(device=torch.device(device), dtype=dtype, steps=SimpleNamespace(builds_steps=compiled))


@pytest.mark.parametrize("flags, target, want", [
    (["avx512f", "avx512_bf16", "amx_bf16"], fake_target(), torch.bfloat16),
    (["avx512f", "avx512_bf16"], fake_target(), torch.float32),  # no AMX: the bf16 head drafted slower there
    (["avx512f", "avx512_bf16", "amx_bf16"], fake_target(compiled=False), torch.float32),  # eager steps
    (["avx512f", "avx512_bf16", "amx_bf16"], fake_target(dtype=torch.bfloat16), torch.bfloat16),  # the target's own
    (["avx512f", "avx512_bf16", "amx_bf16"], fake_target(dtype=torch.float64), torch.float64),
])
def test_auto_picks_bf16_only_for_an_fp32_target_compiled_on_amx(monkeypatch, flags, target, want):
    monkeypatch.setattr(decoding, "cpu_identity", lambda: {"cpu": "test", "flags": flags})
    dtype, why = draft_dtype_for("auto", target)
    assert dtype == want and why
    assert draft_dtype_for("float32", target)[0] == torch.float32  # asked for: whatever the machine
    assert draft_dtype_for("bfloat16", fake_target(compiled=False))[0] == torch.bfloat16


def test_a_bf16_head_changes_no_output_and_casts_copies_of_the_head():
    target = tiny_target("llama")
    head = random_head(target)
    gen = EagleGenerator(target, head, "eagle1", draft_vocab=torch.arange(16))  # context tokens scored too
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=40, speculative=False, stop_token_ids=set())
    seeded = gen.generate(input_ids=PROMPT, max_new_tokens=40, speculative=False, stop_token_ids=set(),
                          seed=3, temperature=1.0)
    note = gen.use_draft_dtype("bfloat16")
    assert "bfloat16" in note and gen.draft_dtype_note == note
    assert next(gen.head.parameters()).dtype == torch.bfloat16 and gen.head is not head
    assert next(head.parameters()).dtype == target.dtype  # the source is untouched
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=40, stop_token_ids=set())
    drafted = [s.tree_size for s in eagle.steps]
    (drafter,) = gen._drafters.values()
    assert drafter.lm.weight.dtype == torch.bfloat16 and drafter.context_vocab
    assert max(drafted) > 1  # it drafted
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, eagle.token_ids)
    again = gen.generate(input_ids=PROMPT, max_new_tokens=40, stop_token_ids=set(), seed=3, temperature=1.0)
    assert again.token_ids == seeded.token_ids  # reproducible sampling: the seeded vanilla sample itself
    assert gen.generate(input_ids=PROMPT, max_new_tokens=20, stop_token_ids=set(), temperature=1.0,
                        sampling_mode="speculative").token_ids  # multi-round speculative sampling runs on it
    gen.use_draft_dtype("auto")  # eager steps: the target's dtype
    assert gen.head is head and not gen._drafters  # back to the head as it came, drafters rebuilt
    with pytest.raises(EagleError, match="draft dtype 'float16'"):
        gen.use_draft_dtype("float16")


def test_the_cost_curve_of_a_bf16_head_is_keyed_apart():
    from eaglespec.engine.tuning import cost_key

    target = tiny_target("llama")
    gen = EagleGenerator(target, random_head(target), "eagle1")
    same = cost_key(gen)
    gen.use_draft_dtype("auto")
    assert cost_key(gen) == same
    gen.use_draft_dtype("bfloat16")
    assert cost_key(gen)["head"] != same["head"]


def test_a_bad_draft_dtype_is_refused_before_loading():
    with pytest.raises(EagleError, match="draft_dtype='float16'"):
        EagleGenerator.from_pretrained(None, head=None, draft_dtype="float16")


def test_the_cli_takes_draft_dtype():
    from eaglespec.cli.commands import build_parser

    parser = build_parser()
    for command in (["generate"], ["tune", "--head", "h"], ["bench"], ["serve"], ["certify"]):
        args = parser.parse_args(command + ["--draft-dtype", "bfloat16"])
        assert args.draft_dtype == "bfloat16"
        assert parser.parse_args(command).draft_dtype == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--draft-dtype", "int4"])


def test_the_cast_copy_keeps_rope_in_its_dtype_and_drafts_as_the_full_precision_head_does():
    """Only the parameters are cast: RoPE's frequencies stay (a bf16 inv_freq would shift every
    relative angle by its rounding times the distance). The bf16 head's draft is the fp32 head's
    within bf16 rounding: the same top-1 at most positions and log q close, teacher-forced over a prompt."""
    target = tiny_target("llama")
    head = random_head(target)
    gen = EagleGenerator(target, head, "eagle1")
    gen.use_draft_dtype("bfloat16")
    buffers = dict(gen.head.named_buffers())
    assert buffers and all(b.dtype == dict(head.named_buffers())[n].dtype for n, b in buffers.items())
    feats = target.forward(torch.tensor([PROMPT]), target.new_cache())[0]
    embeds = target.embed_tokens(torch.tensor([PROMPT[1:] + [7]]))
    logq = {}
    for name, h in (("full", head), ("bf16", gen.head)):
        dtype = next(h.parameters()).dtype
        out = h(embeds.to(dtype), feats[None].to(dtype))
        logq[name] = torch.log_softmax((out.float() @ target.lm_head.weight.float().T), dim=-1)
    same = (logq["full"].argmax(-1) == logq["bf16"].argmax(-1)).float().mean()
    assert same >= 0.8 and (logq["full"] - logq["bf16"]).abs().max() < 0.5


def test_one_draft_lm_head_serves_every_drafter_and_a_new_head_is_cast_in_turn():
    target = tiny_target("llama")
    gen = EagleGenerator(target, random_head(target), "eagle1", draft_vocab=torch.arange(16))
    gen.use_draft_dtype("bfloat16")
    for tree in ("eagle1", "chain:2"):
        gen.generate(input_ids=PROMPT, max_new_tokens=6, stop_token_ids=set(), tree=tree)
    lms = {id(d.lm) for d in gen._drafters.values()}
    assert len(gen._drafters) == 2 and len(lms) == 1 and gen.draft_lm().weight.dtype == torch.bfloat16
    other = random_head(target, seed=2)
    gen.head = other  # a new head: drafted as given, until cast in turn
    assert gen.head is other and gen.given_head is other and not gen._drafters
    gen.use_draft_dtype("bfloat16")
    assert next(gen.head.parameters()).dtype == torch.bfloat16 and gen.given_head is other


def test_a_bf16_eagle3_head_and_a_bf16_batch_change_no_output():
    from test_eagle3 import eagle3_head

    target = tiny_target("llama")
    gen = EagleGenerator(target, eagle3_head(target), "chain:3")
    vanilla = gen.generate(input_ids=PROMPT, max_new_tokens=32, speculative=False, stop_token_ids=set())
    gen.use_draft_dtype("bfloat16")
    eagle = gen.generate(input_ids=PROMPT, max_new_tokens=32, stop_token_ids=set())
    assert max(s.tree_size for s in eagle.steps) > 1
    assert_same_or_tie(target, PROMPT, vanilla.token_ids, eagle.token_ids)

    gen = EagleGenerator(target, random_head(target), "eagle1", draft_vocab=torch.arange(16))
    prompts = [PROMPT, [40, 41, 5, 40, 99, 12]]
    alone = [gen.generate(input_ids=p, max_new_tokens=24, speculative=False, stop_token_ids=set()).token_ids
             for p in prompts]
    gen.use_draft_dtype("bfloat16")
    batched = gen.generate_batch(input_ids=prompts, max_new_tokens=24, stop_token_ids=set())  # rows' context tokens
    for p, a, b in zip(prompts, alone, batched):
        assert_same_or_tie(target, p, a, b.token_ids)


def test_the_commands_pass_draft_dtype_to_the_generator(monkeypatch):
    from eaglespec.cli.commands import build_parser
    from eaglespec.cli.options import load_generator

    seen = {}

    def fake(*args, **kwargs):
        seen.update(kwargs)
        raise EagleError("stop here")

    monkeypatch.setattr(EagleGenerator, "from_pretrained", fake)
    with pytest.raises(EagleError, match="stop here"):
        load_generator(build_parser().parse_args(["generate", "--draft-dtype", "float32"]))
    assert seen["draft_dtype"] == "float32"


@pytest.mark.parametrize("failing, asked, full", [
    ("the draft head's step for 4 tokens", "auto", False),
    ("the target's step for 1 row(s) x 1 token(s)", "auto", False),
    ("the draft head's step for 4 tokens", "bfloat16", False),  # asked for: no other dtype
    ("the draft head's step for 4 tokens", "auto", True),  # a full disk: building again cannot help
])
def test_tune_measures_with_the_targets_dtype_where_autos_bf16_head_cannot_be_built(tmp_path, monkeypatch, capsys, failing,
                                                                                   asked, full):
    """`eaglespec tune` as from_pretrained: where auto's bf16 head graph fails to build, the cost
    curve is measured with the head in the target's dtype (said on stderr); any other graph's
    failure, a bf16 head asked for, or a full disk stays the one-line error."""
    import errno

    from bench_helpers import tiny_generator

    from eaglespec.cli import commands
    from eaglespec.draft.vocab import FILE as VOCAB_FILE
    from eaglespec.engine import compiled, tuning
    from eaglespec.engine.tuning import AcceptanceStats

    head = tmp_path / "head"
    head.mkdir()
    (head / VOCAB_FILE).write_text("counted\n")  # no recount
    gen = tiny_generator()
    monkeypatch.setattr(EagleGenerator, "from_pretrained", lambda *a, **k: gen)
    monkeypatch.setattr(commands, "sharegpt_prompts", lambda count, skip: ["hello there"])
    monkeypatch.setattr(tuning, "calibrate", lambda gen, prompts, n: AcceptanceStats(((0.5, 0.1),), steps=3))
    monkeypatch.setattr(compiled, "use_compiled", lambda target, mode, **kw: "compiled step (a test's)")
    monkeypatch.setattr(decoding, "draft_dtype_for", lambda choice, target: (
        (torch.bfloat16, "auto: AMX") if choice == "auto" else (getattr(torch, choice), "asked for")))
    measured = []

    def tune(gen, stats, **kwargs):
        measured.append(gen.draft_dtype)
        if gen.draft_dtype == torch.bfloat16:
            cause = OSError(errno.ENOSPC, "No space left on device", "x.pt2") if full else \
                RuntimeError("C++ compile failed:\nerror: no bf16 here")
            raise compiled.CompileFailed(failing, tmp_path, cause)
        raise SystemExit(0)  # measured: the rest of the command is tested elsewhere

    monkeypatch.setattr(tuning, "tune", tune)
    command = ["tune", "--head", str(head), "--draft-dtype", asked]
    if failing.startswith("the draft") and asked == "auto" and not full:
        with pytest.raises(SystemExit):
            commands.main(command)
        assert measured == [torch.bfloat16, torch.float32]
        assert "draft head in float32 (auto's bfloat16 head could not be built: building the draft head's step" \
            in capsys.readouterr().err
    else:
        assert commands.main(command) != 0
        assert measured == [torch.bfloat16]
        err = capsys.readouterr().err
        assert ("no space left" if full else "no bf16 here") in err and "--compile off" in err
