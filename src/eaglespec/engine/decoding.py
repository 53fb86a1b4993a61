"""The generator: a target, an optional EAGLE head and a tree, and the APIs over the one
generation loop (batch.py). With a drafter it is EAGLE; without one it is vanilla decoding, which
is the baseline every lossless test and benchmark compares against.

Each step: the drafter grows a tree under the current root token (the last token the target chose
but has not yet run), the target verifies the whole tree in one forward, the accepted path's KV
entries and features are kept, and the target's next token (bonus or recovered) becomes the root.
`stream` runs a batch of one; `generate_batch` and the server run many sequences together.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..core.config import DEFAULT_SAMPLING_MODE, REPRODUCIBLE, SPECULATIVE, DynamicTreeSpec, SamplingParams, parse_tree
from ..core.tree import StaticTree
from ..core.verify import Acceptance
from ..draft.drafter import Drafter, DraftTree
from ..draft.head import EagleHead
from ..draft.heads import load_head
from ..draft.vocab import DEFAULT_SIZE as DEFAULT_DRAFT_VOCAB
from ..draft.vocab import load_draft_vocab
from ..errors import EagleError
from .batch import Batch, StepOutput, StepStats
from .target import TargetModel, check_device, cpu_identity, default_dtype, load_target
from .tuning import STATS_FILE, AdaptiveTree, rerank_top_k

INEXACT_TREES = ("its trees may verify tokens whose logits differ from one-token decoding by more than fp32 "
                 "summation order, so a sampled id could change with the tree or the batch")


@dataclass
class GenerationResult:
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None
    steps: list[StepStats] = field(default_factory=list)
    prompt_tokens: int = 0
    elapsed: float = 0.0            # seconds from the start of prefill to the last token
    finish_reason: str = "length"   # "stop" (an end-of-sequence token) or "length"

    def add(self, step: StepOutput) -> None:
        """Take one output of `EagleGenerator.stream`; the first is the prefill's token, not a
        verification step. Callers that stop early (cancel, stop string) set finish_reason."""
        if self.token_ids:
            self.steps.append(step.stats)
        self.token_ids.extend(step.tokens)
        if step.finish_reason is not None:
            self.finish_reason = step.finish_reason

    @property
    def target_forwards(self) -> int:
        """Decoding forwards of the target: one per step, plus the prefill."""
        return len(self.steps) + 1

    @property
    def tau(self) -> float:
        """Average acceptance length: tokens per verification step, bonus token included. The
        first token comes from the prefill and is not counted."""
        return sum(s.emitted for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.elapsed if self.elapsed > 0 else 0.0


def _verified_tokens(tree) -> int | None:
    """The tokens one verification of a parsed `tree` runs (root included), or None for 'auto'
    (its trees stay within compiled.AUTO_TOKENS) and for no tree."""
    if tree is None or isinstance(tree, str):  # 'auto'
        return None
    return tree.total_tokens + 1 if isinstance(tree, DynamicTreeSpec) else tree.num_nodes


DRAFT_DTYPES = ("auto", "float32", "bfloat16")


def draft_dtype_for(choice: str, target: TargetModel) -> tuple[torch.dtype, str]:
    """The draft head's dtype -> (dtype, why). 'float32' | 'bfloat16': that one. 'auto': bf16 where
    the target runs fp32 on a CPU with AMX through the compiled steps (inductor's AMX bf16 GEMMs
    drafted a round 0.8-1.0 ms faster on the AMX kind, docs/benchmarks.md), else the target's
    own (on an AVX512-BF16 CPU without AMX the bf16 head drafted slower). The head only proposes
    tokens: verification is exact whatever it runs in, so this choice is about speed alone."""
    if choice != "auto":
        return (torch.float32 if choice == "float32" else torch.bfloat16), "asked for"
    if target.device.type != "cpu" or target.dtype != torch.float32 or not target.steps.builds_steps:
        return target.dtype, "the target's; auto picks bf16 only for an fp32 target on compiled CPU steps"
    if "amx_bf16" not in cpu_identity()["flags"]:
        return target.dtype, "the target's; auto picks bf16 only on a CPU with AMX"
    return torch.bfloat16, "auto: AMX bf16 GEMMs draft faster here; the head only proposes, outputs are unchanged"


def float32_head_retry(choice: str, target: TargetModel, exc) -> str | None:
    """After a compiled graph failed to build (compiled.CompileFailed `exc`): where it was auto's
    bf16 head's own graph (draft_dtype_for: only for an fp32 target), and not for a full disk
    (building again cannot help), the note to draft with the head in float32, still compiled;
    else None (from_pretrained and `eaglespec tune` retry so)."""
    if choice != "auto" or draft_dtype_for("auto", target)[0] == target.dtype or exc.full \
            or not exc.what.startswith("the draft"):
        return None
    return f"auto's bfloat16 head could not be built: {exc.reason}"


class EagleGenerator:
    """Owns a target, an optional EAGLE head and a tree; generates one request at a time."""

    def __init__(self, target: TargetModel, head=None, tree="eagle1",
                 draft_vocab: torch.Tensor | None = None, head_note: str = "", drafter: Drafter | None = None,
                 head_dir: Path | None = None):
        """head: an EagleHead or Eagle3Head (draft/contract.py), or None. tree: a spec string (see
        `config.parse_tree`) or a StaticTree / DynamicTreeSpec; 'auto' is resolved by
        `from_pretrained` (see `tuning.use_auto_tree`). drafter: a ready drafter
        used for every request (tests, other draft methods); by default one is built from `head`
        for each tree asked for."""
        if tree == "auto":
            raise EagleError("tree='auto' is tuned from a head directory's acceptance.json: use "
                             "EagleGenerator.from_pretrained(..., tree='auto'), or tuning.use_auto_tree(gen)")
        self.target = target
        self.drafter = drafter
        self._drafters: dict = {}
        self.head = head  # the head as it came in (`head`'s setter); use_draft_dtype may run a cast copy
        self.draft_vocab = draft_vocab
        self.head_note = head_note  # said to the user, e.g. "freshly initialised head"
        self.head_dir = head_dir
        self.tuned = None  # the TunedTree when tree='auto' was tuned
        self.numerics = None  # numerics.NumericsReport: batch invariance in this dtype, when measured
        self.numerics_note = ""  # what dtype 'auto' chose and why
        self.compile_note = ""  # which decoding step runs (compiled or eager) and why
        self.adaptive = True  # with a tuned tree: tuning.AdaptiveTree moves between sizes while decoding
        self.rerank = True  # with a tuned tree: a lone sequence grows each size EAGLE-2 style (tuning.rerank_top_k)
        self.context_vocab = True  # a reduced draft vocabulary also scores each row's own context tokens (Drafter)
        self.draft_floor: float | None = None  # a lone sequence's confidence floor; None: the tuned one for auto
        self._whole = False  # inside `whole_trees`: no confidence floor (every level drafted)
        self.inexact_trees = False  # from_pretrained(allow_inexact=True): reproducible sampling cannot hold
        self.last_policy = None  # the AdaptiveTree of the latest batch (what it chose, for benches and tests)
        self.tree = parse_tree(tree) if isinstance(tree, str) else tree

    @property
    def head(self):
        """The head the drafters run: the one given, or use_draft_dtype's cast copy of it."""
        return self._head

    @head.setter
    def head(self, head) -> None:
        """A new head: drafted with from now on, in its own dtype (use_draft_dtype casts copies of it)."""
        self._head_source = self._head = head
        self._drafters, self._draft_lm = {}, None
        self.draft_dtype_note = ""  # the head's dtype, when use_draft_dtype chose one, and why

    @property
    def draft_dtype(self) -> torch.dtype | None:
        """The dtype the head drafts in (None without a head)."""
        return None if self._head is None else next(self._head.parameters()).dtype

    @property
    def given_head(self):
        """The head as it came in, in its own dtype (what its weights' digest names)."""
        return self._head_source

    def draft_lm(self):
        """The head's draft LM head over the draft vocabulary, in the head's dtype: one for every
        drafter of this head (for an EAGLE-1 head a cut or cast copy of the target's LM head)."""
        if self._draft_lm is None or self._draft_lm[0] is not self.draft_vocab:  # kept per vocabulary
            lm = self.head.draft_lm(self.target, self.draft_vocab).to(self.draft_dtype)
            self._draft_lm = (self.draft_vocab, lm)
        return self._draft_lm[1]

    def use_draft_dtype(self, choice: str = "auto", why: str = "") -> str:
        """Run the head in the dtype `choice` asks for (`draft_dtype_for`, on the target's steps as
        they are now): a copy of the head as it came in, its parameters cast (its buffers, RoPE's
        frequencies, stay as they are), and the drafters built again on the next request; the
        tuned tree and the built graphs stay (from_pretrained calls it before tuning). The head only
        proposes tokens: with exact trees no choice changes an output. why: said instead of
        draft_dtype_for's reason. -> what was chosen and why."""
        if choice not in DRAFT_DTYPES:
            raise EagleError(f"draft dtype {choice!r}: choose one of {', '.join(DRAFT_DTYPES)}")
        source = self._head_source
        if source is None:
            return ""
        dtype, chosen = draft_dtype_for(choice, self.target)
        if next(source.parameters()).dtype == dtype:
            head = source
        else:
            head = copy.deepcopy(source)
            for param in head.parameters():
                param.data = param.data.to(dtype)
        self._head, self._drafters, self._draft_lm = head, {}, None
        self.draft_dtype_note = f"draft head in {str(dtype).removeprefix('torch.')} ({why or chosen})"
        return self.draft_dtype_note

    @classmethod
    def from_pretrained(cls, target: str | None = None, head: str | None = "default", tree="eagle1",
                        device: str = "cpu", dtype: torch.dtype | str | None = None,
                        draft_vocab_size: int | None = DEFAULT_DRAFT_VOCAB, retune: bool = False,
                        max_batch: int = 1, quantize: str | None = None,
                        allow_inexact: bool = False, compile: str | None = None,
                        draft_floor: float | None = None, context_vocab: bool = True,
                        draft_dtype: str = "auto") -> "EagleGenerator":
        """target: HF directory, .gguf file or None (default SmolLM2). head: a head directory (EAGLE-1
        or EAGLE-3), the name of a shipped head, 'default' (the head shipped for this target, else a
        freshly initialised one), or None (vanilla decoding). draft_vocab_size: how many of an EAGLE-1
        head's most frequent tokens the draft scores (when the head ships a ranking); None = the
        full vocabulary. retune: with tree='auto', measure this machine's step costs again instead
        of reading them from the cache (`tuning.use_auto_tree`). max_batch: with tree='auto', also
        tune the tree for batches of up to this many sequences (the server's --max-batch).
        dtype: a torch dtype, 'float32' | 'bfloat16' | 'float16', 'auto' (numerics.choose_dtype: the
        fastest dtype whose tree verification is exact on this machine; said in gen.numerics_note),
        or None (float32 on a CPU, bfloat16 on CUDA). quantize: None or 'int8' (quant.py: a
        weight-only int8 target, which is then the verifier). allow_inexact: let tree='auto' use
        tree sizes whose verification differs from one-at-a-time decoding by more than fp32
        summation order ("lossless up to floating-point rounding"; numerics.py). compile: 'auto'
        (where a C++ compiler is there; eager on CUDA, and where a graph fails to build as it
        starts: compiled.CompileFailed), 'on', 'off' (eager kernels), or None: the
        EAGLESPEC_COMPILE environment variable, else 'auto' (compiled.py; said in gen.compile_note).
        draft_floor: a lone sequence's confidence floor in [0, 1) (draft/drafter.py; `floor_for`), or
        None: the tuned one with tree='auto', 0 (the whole tree) otherwise. draft_dtype: the head's
        dtype, 'auto' | 'float32' | 'bfloat16' (`draft_dtype_for`; said in gen.draft_dtype_note).

        The device, the tree and the head's own files are checked before the target loads (which
        can take minutes); what needs the target (sizes, layers, vocabulary) is checked after."""
        if draft_floor is not None and not 0 <= draft_floor < 1:
            raise EagleError(f"draft_floor={draft_floor}: give a probability in [0, 1) (0 drafts the whole tree every step)")
        if draft_dtype not in DRAFT_DTYPES:
            raise EagleError(f"draft_dtype={draft_dtype!r}: choose one of {', '.join(DRAFT_DTYPES)}")
        from ..draft.heads import inspect_head
        from ..draft.shipped import default_head_dir, head_dir_for
        from ..draft.vocab import check_draft_vocab
        from .tuning import AcceptanceStats, use_auto_tree

        def check_head_dir(head_dir: Path) -> None:
            """The files it will read, without its tensors (headers only)."""
            if inspect_head(head_dir).kind == "eagle1" and draft_vocab_size is not None:
                check_draft_vocab(head_dir)
            if tree == "auto":
                AcceptanceStats.load(head_dir)

        check_device(device)
        parsed = parse_tree(tree) if isinstance(tree, str) and tree != "auto" else tree
        head_dir = None
        if head not in (None, "default"):
            head_dir = head_dir_for(head) or Path(head)
            check_head_dir(head_dir)
        from .numerics import DTYPES, check_dtype_runs, choose_dtype, numerics_for, parse_dtype
        from .quant import quantize_target

        from .compiled import CompileFailed, check_limits, compile_mode, use_compiled

        compile = compile_mode(compile, quantize)
        limits = dict(tokens=_verified_tokens(parsed), rows=max_batch)
        check_limits(compile, **limits)  # --compile on with a tree or batch beyond its buckets: before loading
        if isinstance(dtype, str):
            parse_dtype(dtype)
            if dtype != "auto":
                check_dtype_runs(dtype, device)
        load_dtype = (torch.float32 if dtype == "auto" else DTYPES[dtype] if isinstance(dtype, str)
                      else dtype or default_dtype(device))
        tm = load_target(target, load_dtype, device)
        if head == "default":
            head_dir = default_head_dir(tm)  # by the weights' fingerprint, before quantizing
        quantize_target(tm, quantize)
        numerics, numerics_note = None, ""
        if dtype == "auto":
            tm, numerics, numerics_note = choose_dtype(tm, device, retune)
        model, note, draft_vocab = None, "", None
        if head == "default" and head_dir is None:
            with torch.random.fork_rng():
                torch.manual_seed(0)
                model = EagleHead(tm.config)
            note = "no trained head ships for this target: using a freshly initialised (random) head, expect tau ~1"
            warnings.warn(note, stacklevel=2)
        elif head is not None:
            if head == "default":  # a named or given one was checked before loading
                check_head_dir(head_dir)
            model = load_head(head_dir, tm.config)
            if model.kind == "eagle1":  # an EAGLE-3 head brings its own draft vocabulary
                draft_vocab = load_draft_vocab(head_dir, draft_vocab_size, tm.vocab_size)
        if model is not None:
            model = model.to(device=tm.device, dtype=tm.dtype)

        def finish(compile_note: str, numerics, draft: str = draft_dtype, draft_why: str = "") -> "EagleGenerator":
            """The generator on tm's steps as they are now: trees gated and tuned, steps warmed."""
            if tree == "auto" and model is not None and (numerics is None or tm.steps.builds_steps):
                # what gates the trees is the kernels that verify them: choose_dtype measured the eager
                # ones, and a compiled step rounds otherwise (measured on its own query buckets, and on
                # EAGLE-1's tree's where a head without acceptance.json would verify that)
                sizes = None
                untuned = head_dir is None or not (head_dir / STATS_FILE).is_file()
                if tm.steps.builds_steps and untuned:
                    sizes = (*tm.steps.invariance_sizes, parse_tree("eagle1").num_nodes + 1)
                numerics = numerics_for(tm, sizes, retune=retune)
            if model is None:
                gen = cls(tm, None, "none" if tree == "auto" else tree)
            else:
                gen = cls(tm, model, "eagle1" if tree == "auto" else tree, draft_vocab=draft_vocab, head_note=note,
                          head_dir=head_dir)
                gen.inexact_trees = allow_inexact
                gen.draft_floor = draft_floor
                gen.context_vocab = context_vocab
                gen.use_draft_dtype(draft, draft_why)  # before tuning: the cost curve times this head
            gen.numerics, gen.numerics_note, gen.compile_note = numerics, numerics_note, compile_note
            if model is not None and tree == "auto":
                limit = None if allow_inexact or numerics is None else numerics.tree_limit()
                use_auto_tree(gen, retune=retune, max_batch=max_batch, max_tokens=limit)
            gen.warm()
            return gen

        eager_steps = tm.steps
        compile_note = use_compiled(tm, compile, **limits)
        try:
            return finish(compile_note, numerics)
        except CompileFailed as exc:
            if tm.steps is eager_steps:
                raise
            retry_head = float32_head_retry(draft_dtype, tm, exc) if model is not None else None
            if compile != "auto" and retry_head is None:
                raise
            reason = exc.reason  # the retries run outside this block: the failed attempt's steps are let go
        if retry_head is not None:
            try:  # the head in the target's dtype, still compiled
                return finish(compile_note, numerics, "float32", retry_head)
            except CompileFailed as exc:
                if compile != "auto":
                    raise
                reason = exc.reason
        tm.steps = eager_steps  # --compile auto: a graph that cannot be built means the eager kernels
        return finish(f"eager kernels: {reason}", numerics)

    @torch.no_grad()
    def warm(self, contexts: tuple[int, ...] = (), trees: tuple = (), vanilla: bool = True) -> None:
        """Where the backend builds its steps (the compiled path), build or load now every step the
        first requests will run: vanilla and each tree --tree auto may move between (a package
        loads in about a second; building one takes minutes), so that no generation pays for it.
        contexts: also for each cache size these requests will need (prompt + new tokens; the
        backend's `cache_bucket` groups them: one warm-up per bucket). trees: more trees to warm
        (a benchmark's methods). vanilla: False skips the vanilla steps (a second warm-up whose
        vanilla steps are built already). Eager: nothing to do."""
        steps = self.target.steps
        if not steps.builds_steps:
            return
        prompt = list(range(1, 9))
        trees = [*([t for _, t in self.tuned.trees] if self.tuned is not None else [self.tree]), *trees]
        drafts = [t for t in dict.fromkeys(trees) if t is not None and (self.head is not None or self.drafter is not None)]
        drafts += self._floored_sizes(drafts)
        built = {steps.cache_bucket(len(prompt) + 3)}  # the short generations at the end build this one
        with self.whole_trees():  # a confidence floor would cut the trees short of their widths
            for context in sorted(contexts, reverse=True):  # the longest context of each bucket
                if steps.cache_bucket(context) in built:
                    continue
                built.add(steps.cache_bucket(context))
                budget = max(context - len(prompt), 3)  # the cache is sized for the whole budget: a few steps build it
                for tree in [None, *drafts] if vanilla else drafts:
                    for _ in itertools.islice(self.stream(prompt, budget, tree=tree, speculative=tree is not None,
                                                          stop_token_ids=set()), 3):
                        pass
            if vanilla:
                self.generate(input_ids=prompt, max_new_tokens=3, speculative=False, stop_token_ids=set())
            for tree in drafts:
                self.generate(input_ids=prompt, max_new_tokens=3, tree=tree, stop_token_ids=set())

    def _floored_sizes(self, trees: list) -> list:
        """A chain for each smaller verification width that a lone sequence's tree with a
        confidence floor may verify (the floor cuts it to fewer nodes), so that those graphs are
        built with the rest (the chains' own head steps too: a few more, seconds each); --tree
        auto's trees need none (its smaller trees are warmed already)."""
        from .compiled import QUERY_BUCKETS, bucket

        widths = set()
        for tree in trees:
            if self.floor_for(tree) > 0 and not self._is_tuned(tree):
                widths |= {b for b in QUERY_BUCKETS if 2 <= b < bucket(_verified_tokens(tree), QUERY_BUCKETS)}
        return [parse_tree(f"chain:{b - 1}") for b in sorted(widths)]

    @torch.no_grad()
    def warm_batches(self, max_batch: int, say: Callable[[str], None] | None = None) -> None:
        """`warm` for batches: build or load the steps of every rows bucket above one up to
        max_batch's (2, 4, 8, ...), so that a server's first concurrent requests decode at once
        instead of compiling inside its loop (minutes a graph on a small CPU; a later start loads
        them in seconds). A batch of n rows runs in bucket(n) with the tree chosen for n (`--tree
        auto` tunes smaller trees, or none, for larger batches; 3 rows run in the 4-row bucket with
        the 2-row choice), so each bucket runs once per distinct choice of the sizes it holds; and
        vanilla steps twice, as the server runs them (sequences without drafts in a drafting batch:
        EAGLE-3's feature layers) and as `generate_batch(speculative=False)` does. Rows leaving or
        joining move a batch between these same (bucket, choice) pairs. The 24-token prompt, like a
        chat prompt, is longer than the head's compiled widths, so its prefill pairs run eagerly,
        as a real prompt's do. say: progress lines. Eager: nothing to do. A max_batch beyond the
        largest bucket is an EagleError (before any building)."""
        from .compiled import BATCH_BUCKETS, bucket

        steps = self.target.steps
        if not steps.builds_steps:
            return
        top = bucket(max_batch, BATCH_BUCKETS)
        prompt, sampling = list(range(1, 25)), SamplingParams()
        drafter = self._drafter(self.tree)
        sized = self._sized(self.tree, drafter) or (lambda size: drafter)

        def run(batch: Batch, rows: int, speculative: bool) -> None:
            for _ in range(rows):
                batch.add(prompt, 8, sampling, set(), keep_prefill=True, speculative=speculative)
            while len(batch):
                batch.step()

        below = 1
        for rows in (b for b in BATCH_BUCKETS if 1 < b <= top):
            start, before = time.perf_counter(), steps.stats.graphs
            if say is not None:
                say(f"batch steps for {rows} rows: building or loading (minutes a step the first time on a small CPU)")
            choices = {}  # one batch size per distinct drafter (None: no drafts) among the sizes of this bucket
            for n in range(below + 1, min(rows, max_batch) + 1):
                choices.setdefault(id(sized(n)), n)
            for n in choices.values():
                run(self.new_batch(), n, True)
            run(self.new_batch(), rows, False)  # the server's vanilla rows (a request's "speculative": false)
            run(self.new_batch(speculative=False), rows, True)  # a batch without a drafter
            below = rows
            if say is not None:
                say(f"batch steps for {rows} rows ready: {steps.stats.graphs - before} step(s) in "
                    f"{time.perf_counter() - start:.0f} s")

    # -- prompts ------------------------------------------------------------------------------
    def encode(self, prompt: str | None = None, messages: list[dict] | None = None, chat_template: bool = True,
               tokenizer=None) -> list[int]:
        """Text -> ids. Message contents and prompts are tokenized as text: a special-token string
        in them is spelled out, never parsed (control tokens come from the chat template only).
        `tokenizer`: a copy of the target's to use instead (a server encodes requests in threads
        of its own while the decoding loop detokenizes with the target's)."""
        from .prompts import encode_chat, encode_text, prompt_text  # here, not at the top: this method owns prompt encoding

        tok = tokenizer if tokenizer is not None else self.target.tokenizer
        if tok is None:
            raise EagleError("this target has no tokenizer: pass input_ids")
        if messages is None:
            if prompt is None:
                raise EagleError("give a prompt, messages or input_ids")
            messages = [{"role": "user", "content": prompt}]
        if chat_template and tok.chat_template:
            return encode_chat(tok, messages)
        return encode_text(tok, prompt if prompt is not None else prompt_text(tok, messages, chat_template=False))

    def decode(self, ids: list[int]) -> str | None:
        tok = self.target.tokenizer
        return None if tok is None else tok.decode(ids, skip_special_tokens=True)

    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self.target.model, "generation_config", None), self.target.config):
            eos = getattr(source, "eos_token_id", None) if source is not None else None
            ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        tok = self.target.tokenizer
        if tok is not None and tok.eos_token_id is not None:
            ids.add(tok.eos_token_id)
        return ids

    @property
    def default_sampling_mode(self) -> str:
        """The sampling mode of a call that names none: reproducible, or speculative where
        reproducible cannot hold (allow_inexact)."""
        return SPECULATIVE if self.inexact_trees else DEFAULT_SAMPLING_MODE

    def check_sampling(self, sampling: SamplingParams) -> None:
        """Refuse, naming the field, a sampling mode whose guarantee this generator cannot keep."""
        if sampling.mode == REPRODUCIBLE and self.inexact_trees and sampling.temperature > 0:  # greedy: unaffected
            raise EagleError(f"sampling_mode 'reproducible' cannot hold on this generator (allow_inexact): {INEXACT_TREES}; "
                             "pass sampling_mode='speculative'")

    # -- the loop -----------------------------------------------------------------------------
    def _drafter(self, tree) -> Drafter | None:
        if tree is None:
            return None
        if self.drafter is not None:
            return self.drafter
        if self.head is None:
            return None
        floor, rerank = self.floor_for(tree), self.rerank_for(tree)
        key = (str(tree) if isinstance(tree, DynamicTreeSpec) else tree.paths, floor, rerank, self.context_vocab)
        if key not in self._drafters:
            self._drafters[key] = Drafter(self.head, self.target, tree, self.draft_vocab, floor, rerank, self.context_vocab,
                                          lm=self.draft_lm())
        return self._drafters[key]

    def rerank_for(self, tree) -> int:
        """The top-k with which a lone sequence grows `tree` EAGLE-2 style (Drafter's rerank): that
        of --tree auto's tuned trees unless `rerank` is off, else 0 (the tree's own shape)."""
        if not self.rerank or not self._is_tuned(tree):
            return 0
        return rerank_top_k(tree.num_nodes - 1, tree.depth)

    def _is_tuned(self, tree) -> bool:
        """`tree` is one of --tree auto's tuned trees (the objects themselves)."""
        return self.tuned is not None and any(tree is t for _, t in self.tuned.trees)

    @contextlib.contextmanager
    def whole_trees(self):
        """Inside the block no confidence floor applies (every level drafted, a static tree's every
        node verified): for warming up (every width must be built) and calibration (which reads
        each node's rank and depth). Tuned trees are still grown EAGLE-2 style for one sequence."""
        before, self._whole = self._whole, True
        try:
            yield
        finally:
            self._whole = before

    def floor_for(self, tree) -> float:
        """The confidence floor `tree` drafts with (draft/drafter.py): `draft_floor` when set, else
        the tuned one for --tree auto's trees, else 0 (the whole tree)."""
        if tree is None or self._whole:
            return 0.0
        if self.draft_floor is not None:
            return self.draft_floor
        if not self._is_tuned(tree):
            return 0.0
        return round(self.tuned.floor, 3)

    def new_batch(self, tree="default", speculative: bool = True) -> Batch:
        """An empty batch that sequences join (`Batch.add`) and step together. With the generator's
        tuned `auto` tree, each step's tree follows the number of sequences in it."""
        tree = self.tree if tree == "default" else parse_tree(tree) if isinstance(tree, str) else tree
        drafter = self._drafter(tree) if speculative else None
        sized = self._sized(tree, drafter)
        choose = report = None
        if sized is not None and self.adaptive:
            policy = AdaptiveTree.from_tuned(self.tuned)
            self.last_policy = policy

            def choose(size: int) -> Drafter | None:
                return self._drafter(policy.tree) if size == 1 else sized(size)

            lone = None  # the sequence the policy's evidence is about

            def report(seqs: list, outputs: list[StepOutput]) -> None:
                nonlocal lone
                if len(seqs) != 1:
                    return
                if seqs[0] is not lone:
                    earlier, lone = lone, seqs[0]
                    if earlier is not None:  # another text (a server's next request): start afresh,
                        policy.reset()       # this first step (taken at the last text's choice) aside
                        return
                out = outputs[0]
                if out.finish_reason is None:  # a last step is cut short (stop, budget): not evidence
                    policy.observe(out.stats.emitted, policy.step_cost(out.stats.tree_size, out.stats.levels))
        elif sized is not None:
            choose = sized
        return Batch(self.target, drafter, choose, report)

    def _sized(self, tree, drafter: Drafter | None) -> Callable[[int], Drafter | None] | None:
        """With the tuned `auto` tree (adaptive, or tuned per batch size): the drafter a batch of n
        sequences runs (`tune` may choose smaller trees, or none, for larger batches); else None."""
        tuned = self.tuned
        if drafter is None or tuned is None or tree is not tuned.tree or not (self.adaptive or tuned.by_batch):
            return None
        return lambda size: self._drafter(tuned.tree_for(size))

    @torch.no_grad()
    def stream(self, input_ids: list[int], max_new_tokens: int = 256, sampling: SamplingParams = SamplingParams(),
               tree="default", speculative: bool = True, stop_token_ids: set[int] | None = None,
               observe: Callable[[DraftTree, torch.Tensor, Acceptance], None] | None = None) -> Iterator[StepOutput]:
        """Yield the accepted tokens of each step. tree: 'default' (the generator's), a spec string,
        a StaticTree / DynamicTreeSpec, or None; speculative=False is vanilla decoding.
        observe(tree, target_logits [N, V], acceptance) sees every verification (tree tuning)."""
        if isinstance(input_ids, torch.Tensor):  # HF users pass [1, T] tensors
            input_ids = input_ids.flatten().tolist()
        self.check_sampling(sampling)
        batch = self.new_batch(tree, speculative)
        stops = self.eos_token_ids() if stop_token_ids is None else stop_token_ids
        seq, first = batch.add(input_ids, max_new_tokens, sampling, stops)
        yield first
        while not seq.done:
            ((_, out),) = batch.step(observe)
            yield out

    def generate_batch(self, prompts: list[str] | None = None, *, input_ids: list[list[int]] | None = None,
                       max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                       seed: int | None = None, tree="default", speculative: bool = True, chat_template: bool = True,
                       stop_token_ids: set[int] | None = None, sampling_mode: str | None = None) -> list[GenerationResult]:
        """Blocking generation of several prompts decoded together (one draft pass and one target
        forward per step for all; see batch.py). Sequence i samples with seed + i when a seed is given
        (in sampling_mode 'reproducible': exactly what `generate(..., seed=seed + i)` gives).
        Each result's `elapsed` is the batch's wall time up to that sequence's last token."""
        if input_ids is None:
            if prompts is None:
                raise EagleError("give prompts or input_ids")
            input_ids = [self.encode(p, None, chat_template) for p in prompts]
        batch = self.new_batch(tree, speculative)
        stops = self.eos_token_ids() if stop_token_ids is None else stop_token_ids
        results = [GenerationResult(prompt_tokens=len(ids)) for ids in input_ids]
        start = time.perf_counter()
        owner = {}
        for i, ids in enumerate(input_ids):
            sampling = SamplingParams(temperature, top_p, top_k, None if seed is None else _nth_seed(seed, i),
                                      sampling_mode or self.default_sampling_mode)
            self.check_sampling(sampling)
            again = i + 1 < len(input_ids) and list(input_ids[i + 1]) == list(ids)  # copies share one prefill
            seq, first = batch.add(list(ids), max_new_tokens, sampling, stops, keep_prefill=again)
            results[i].add(first)
            owner[id(seq)] = i
        while len(batch):
            for seq, out in batch.step():
                results[owner[id(seq)]].add(out)
                if out.finish_reason is not None:
                    results[owner[id(seq)]].elapsed = time.perf_counter() - start
        for r in results:
            r.elapsed = r.elapsed or time.perf_counter() - start
            r.text = self.decode(r.token_ids)
        return results

    def generate(self, prompt: str | None = None, *, input_ids: list[int] | None = None, messages: list[dict] | None = None,
                 max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 seed: int | None = None, tree="default", speculative: bool = True, chat_template: bool = True,
                 stop_token_ids: set[int] | None = None, sampling_mode: str | None = None) -> GenerationResult:
        """Blocking generation: collects `stream`. sampling_mode: 'speculative' (multi-round speculative
        sampling: the target's distribution) or 'reproducible' (with a seed, the same ids as seeded
        vanilla sampling, alone or in any batch, with any tree); see SamplingParams."""
        sampling = SamplingParams(temperature, top_p, top_k, seed, sampling_mode or self.default_sampling_mode)
        if input_ids is None:
            input_ids = self.encode(prompt, messages, chat_template)
        result = GenerationResult(prompt_tokens=len(input_ids))
        start = time.perf_counter()
        for step in self.stream(input_ids, max_new_tokens, sampling, tree, speculative, stop_token_ids):
            result.add(step)
        result.elapsed = time.perf_counter() - start
        result.text = self.decode(result.token_ids)
        return result


def _nth_seed(seed: int, i: int) -> int:
    """Sequence i's seed in a batch: seed + i, wrapped into 64 bits past 2**64 - 1."""
    return seed + i if seed + i < 2**64 else (seed + i) % 2**64
