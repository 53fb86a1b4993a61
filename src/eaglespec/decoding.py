"""The one generation loop. With a drafter it is EAGLE; without one it is vanilla decoding, which is
the baseline every lossless test and benchmark compares against.

Each step: the drafter grows a tree under the current root token (the last token the target chose
but has not yet run), the target verifies the whole tree in one forward, the accepted path's KV
entries and features are kept, and the target's next token (bonus or recovered) becomes the root.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from .config import DynamicTreeSpec, SamplingParams, parse_tree
from .draft.drafter import Drafter, DraftTree
from .draft.head import EagleHead
from .draft.heads import load_head
from .draft.vocab import DEFAULT_SIZE as DEFAULT_DRAFT_VOCAB
from .draft.vocab import load_draft_vocab
from .errors import EagleError
from .kv_cache import cache_length, keep_path
from .sampling import logits_to_probs, sample
from .target import TargetModel, default_dtype, load_target
from .tree import StaticTree, buffers_from_parents
from .verify import Acceptance, verify_greedy, verify_sampling

_ROOT_ONLY = buffers_from_parents(torch.tensor([-1]))


@dataclass(frozen=True)
class StepStats:
    accepted: int    # draft tokens the target accepted this step (0 for vanilla)
    emitted: int     # tokens this step added to the output (accepted + 1, cut at a stop)
    tree_size: int   # tokens the target verified (root included)


@dataclass(frozen=True)
class StepOutput:
    tokens: list[int]  # the new tokens, in order
    stats: StepStats
    finish_reason: str | None = None  # on the stream's last output: "stop" (a stop token) or "length"


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


class EagleGenerator:
    """Owns a target, an optional EAGLE head and a tree; generates one request at a time."""

    def __init__(self, target: TargetModel, head=None, tree="eagle1",
                 draft_vocab: torch.Tensor | None = None, head_note: str = "", drafter: Drafter | None = None,
                 head_dir: Path | None = None):
        """head: an EagleHead or Eagle3Head (draft/heads.py), or None. tree: a spec string (see
        `config.parse_tree`) or a StaticTree / DynamicTreeSpec; 'auto' is resolved by
        `from_pretrained` (see `tuning.use_auto_tree`). drafter: a ready drafter
        used for every request (tests, other draft methods); by default one is built from `head`
        for each tree asked for."""
        if tree == "auto":
            raise EagleError("tree='auto' is tuned from a head directory's acceptance.json: use "
                             "EagleGenerator.from_pretrained(..., tree='auto'), or tuning.use_auto_tree(gen)")
        self.target = target
        self.drafter = drafter
        self.head = head
        self.draft_vocab = draft_vocab
        self.head_note = head_note  # said to the user, e.g. "freshly initialised head"
        self.head_dir = head_dir
        self.tuned = None  # the TunedTree when tree='auto' was tuned
        self._drafters: dict = {}
        self.tree = parse_tree(tree) if isinstance(tree, str) else tree

    @classmethod
    def from_pretrained(cls, target: str | None = None, head: str | None = "default", tree="eagle1",
                        device: str = "cpu", dtype: torch.dtype | None = None,
                        draft_vocab_size: int | None = DEFAULT_DRAFT_VOCAB) -> "EagleGenerator":
        """target: HF directory, .gguf file or None (default SmolLM2). head: a head directory (EAGLE-1
        or EAGLE-3), the name of a shipped head, 'default' (the head shipped for this target, else a
        freshly initialised one), or None (vanilla decoding). draft_vocab_size: how many of an EAGLE-1
        head's most frequent tokens the draft scores (when the head ships a ranking); None = the
        full vocabulary."""
        from .draft.shipped import default_head_dir

        tm = load_target(target, dtype or default_dtype(device), device)
        note, head_dir = "", None
        if head is None:
            return cls(tm, None, "none" if tree == "auto" else tree)
        if head == "default":
            head_dir = default_head_dir(tm)
            if head_dir is None:
                with torch.random.fork_rng():
                    torch.manual_seed(0)
                    model = EagleHead(tm.config)
                note = "no trained head ships for this target: using a freshly initialised (random) head, expect tau ~1"
                warnings.warn(note, stacklevel=2)
        else:
            from .draft.shipped import named_head_dir

            head_dir = Path(head) if Path(head).is_dir() else named_head_dir(head) or Path(head)
        if head_dir is not None:
            model = load_head(head_dir, tm.config)
        draft_vocab = None  # an EAGLE-3 head brings its own
        if head_dir is not None and model.kind == "eagle1":
            draft_vocab = load_draft_vocab(head_dir, draft_vocab_size, tm.vocab_size)
        model = model.to(device=tm.device, dtype=tm.dtype)
        gen = cls(tm, model, "eagle1" if tree == "auto" else tree, draft_vocab=draft_vocab, head_note=note,
                  head_dir=head_dir)
        if tree == "auto":
            from .tuning import use_auto_tree

            use_auto_tree(gen)
        return gen

    # -- prompts ------------------------------------------------------------------------------
    def encode(self, prompt: str | None = None, messages: list[dict] | None = None, chat_template: bool = True) -> list[int]:
        tok = self.target.tokenizer
        if tok is None:
            raise EagleError("this target has no tokenizer: pass input_ids")
        if messages is None:
            if prompt is None:
                raise EagleError("give a prompt, messages or input_ids")
            messages = [{"role": "user", "content": prompt}]
        if chat_template and tok.chat_template:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        else:
            text = prompt if prompt is not None else "\n".join(m["content"] for m in messages)
            ids = tok(text)["input_ids"]
        return list(ids)

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

    # -- the loop -----------------------------------------------------------------------------
    def _drafter(self, tree) -> Drafter | None:
        if tree is None:
            return None
        if self.drafter is not None:
            return self.drafter
        if self.head is None:
            return None
        key = str(tree) if isinstance(tree, DynamicTreeSpec) else tree.paths
        if key not in self._drafters:
            self._drafters[key] = Drafter(self.head, self.target, tree, self.draft_vocab)
        return self._drafters[key]

    @torch.no_grad()
    def stream(self, input_ids: list[int], max_new_tokens: int = 256, sampling: SamplingParams = SamplingParams(),
               tree="default", speculative: bool = True, stop_token_ids: set[int] | None = None,
               observe: Callable[[DraftTree, torch.Tensor, Acceptance], None] | None = None) -> Iterator[StepOutput]:
        """Yield the accepted tokens of each step. tree: 'default' (the generator's), a spec string,
        a StaticTree / DynamicTreeSpec, or None; speculative=False is vanilla decoding.
        observe(tree, target_logits [N, V], acceptance) sees every verification (tree tuning)."""
        if max_new_tokens <= 0:
            raise EagleError(f"max_new_tokens must be > 0, got {max_new_tokens}")
        if isinstance(input_ids, torch.Tensor):  # HF users pass [1, T] tensors
            input_ids = input_ids.flatten().tolist()
        if not input_ids:
            raise EagleError("the prompt is empty")
        if min(input_ids) < 0 or max(input_ids) >= self.target.vocab_size:
            raise EagleError(f"prompt token ids must be in [0, {self.target.vocab_size}), got {min(input_ids)}..{max(input_ids)}")
        n = len(input_ids)
        if n >= self.target.max_context:
            raise EagleError(f"the prompt has {n} tokens, the model's context is {self.target.max_context}: shorten the prompt")
        tree = self.tree if tree == "default" else parse_tree(tree) if isinstance(tree, str) else tree
        drafter = self._drafter(tree) if speculative else None
        stops = self.eos_token_ids() if stop_token_ids is None else stop_token_ids
        budget = min(max_new_tokens, self.target.max_context - n)
        generator = torch.Generator(device=self.target.device)
        if sampling.seed is not None:
            generator.manual_seed(sampling.seed)
        else:
            generator.seed()

        target = self.target
        ids = torch.tensor(input_ids, device=target.device)
        cache = target.new_cache()
        layers = drafter.hidden_layers if drafter else None
        states = target.forward_states(ids[None], cache, layers=layers)
        root = self._choose(target.logits(states.features[0, -1:]), sampling, generator)
        produced = 1
        finish = "stop" if root in stops else "length" if produced >= budget else None
        yield StepOutput([root], StepStats(0, 1, n), finish)
        if finish is not None:
            return
        draft_state = drafter.new_state() if drafter else None
        pending_tokens = torch.cat([ids[1:], torch.tensor([root], device=target.device)])  # x[t+1] for each f[t]
        pending_features = states.hidden[0]  # [n, k*H] the head's input for each x[t+1]

        while True:
            past = cache_length(cache)
            if drafter is not None and past + drafter.max_nodes <= target.max_context and produced + 1 < budget:
                dt = drafter.draft(draft_state, pending_tokens, pending_features, root)
            else:  # vanilla, or too close to the end to draft (and it stays so: the head is done)
                drafter = None
                dt = DraftTree(torch.tensor([root], device=target.device), _ROOT_ONLY)
            b = dt.buffers
            states = target.forward_states(dt.tokens[None], cache, b.tree_mask, b.tree_position_ids,
                                           layers if drafter is not None else None)
            logits = target.logits(states.features[0])  # [N, V]
            if sampling.greedy:
                acc = verify_greedy(dt.tokens, logits, b.retrieve_indices.to(logits.device))
            else:
                def probs_at(node: int) -> torch.Tensor:
                    return logits_to_probs(logits[node], sampling.temperature, sampling.top_k, sampling.top_p)

                acc = verify_sampling(dt.tokens, probs_at, b.parents, generator)
            if observe is not None:
                observe(dt, logits, acc)
            keep_path(cache, past, acc.path.to(target.device))
            new = acc.accepted_tokens.tolist() + [acc.next_token]
            emit = []
            for t in new:
                emit.append(t)
                if t in stops or produced + len(emit) >= budget:
                    break
            produced += len(emit)
            finish = "stop" if emit[-1] in stops else "length" if produced >= budget else None
            yield StepOutput(emit, StepStats(acc.num_accepted, len(emit), dt.tokens.numel()), finish)
            if finish is not None:
                return
            pending_tokens = torch.tensor(new, device=target.device)
            pending_features = states.hidden[0][acc.path.to(target.device)]
            root = acc.next_token

    @staticmethod
    def _choose(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> int:
        """The token after the prompt, from the target alone. logits: [1, V]."""
        if sampling.greedy:
            return int(logits[0].argmax())
        probs = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        return int(sample(probs, generator)[0])

    def generate(self, prompt: str | None = None, *, input_ids: list[int] | None = None, messages: list[dict] | None = None,
                 max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 seed: int | None = None, tree="default", speculative: bool = True, chat_template: bool = True,
                 stop_token_ids: set[int] | None = None) -> GenerationResult:
        """Blocking generation: collects `stream`."""
        sampling = SamplingParams(temperature, top_p, top_k, seed)
        if input_ids is None:
            input_ids = self.encode(prompt, messages, chat_template)
        result = GenerationResult(prompt_tokens=len(input_ids))
        start = time.perf_counter()
        for step in self.stream(input_ids, max_new_tokens, sampling, tree, speculative, stop_token_ids):
            result.add(step)
        result.elapsed = time.perf_counter() - start
        result.text = self.decode(result.token_ids)
        return result

