"""The compiled path on a device, in one process: build (timed), then vanilla and EAGLE twice each,
tokens per second and whether the outputs agree. For a GPU lease (scripts/device-call2.sh,
JOBS=probe); EAGLESPEC_COMPILE and EAGLESPEC_COMPILE_PACKAGES choose the path.

    python scripts/compiled-probe.py TARGET HEAD_DIR [cuda|cpu]
"""

import sys
import time

import torch

from eaglespec.engine.decoding import EagleGenerator

PROMPT = "Write a short blog post about a weekend trip to a small coastal town, with two places worth visiting."


def main(target: str, head: str, device: str = "cuda") -> int:
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    start = time.time()
    gen = EagleGenerator.from_pretrained(target, head, "eagle1", device=device,
                                         dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32)
    print(f"PROBE loaded and warmed in {time.time() - start:.1f} s: {gen.compile_note}", flush=True)
    outputs = {}
    for speculative in (False, True, False, True):
        sync()
        began = time.perf_counter()
        result = gen.generate(PROMPT, max_new_tokens=128, speculative=speculative)
        sync()
        seconds = time.perf_counter() - began
        tau = sum(s.emitted for s in result.steps) / max(len(result.steps), 1)
        outputs[speculative] = result.token_ids
        print(f"PROBE {'eagle' if speculative else 'vanilla'}: {len(result.token_ids)} tokens in {seconds:.3f} s = "
              f"{len(result.token_ids) / seconds:.1f} tok/s, tau {tau:.2f}", flush=True)
    print("PROBE identical" if outputs[False] == outputs[True] else "PROBE DIFFERENT", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
