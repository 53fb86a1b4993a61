"""Start a capture of a grown distillation from the capture of its first part: the first N examples
of the new data are checked token for token (input ids and loss mask) against the old capture's,
then its shards are copied into the new folder with a manifest that `eaglespec capture` resumes
from example N (data digest of the new data, not complete). Usage:
  python seed_capture.py OLD_CAPTURE DATA NEW_CAPTURE [--check-only]"""

import json
import shutil
import sys
from pathlib import Path

import torch

from eaglespec.engine.target import load_target
from eaglespec.train.capture import FeatureDataset
from eaglespec.train.config import CaptureConfig
from eaglespec.train.data import DataSummary, iter_examples, source_digest

old, data, new = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
done = FeatureDataset(old)
manifest = json.loads((old / "manifest.json").read_text())
options = manifest["options"]
config = CaptureConfig(data=data, max_length=options["max_length"], overflow=options["overflow"],
                       feature_dtype=options["feature_dtype"], shard_size=options["shard_size"])
target = load_target(None)
examples = iter_examples(target.tokenizer, config, DataSummary())
for i in range(len(done)):
    example = next(examples, None)
    if example is None:
        sys.exit(f"{data} has fewer than {len(done)} examples: capture it from scratch")
    ids, mask = done.tokens(i)
    if not (torch.equal(ids, example.input_ids) and torch.equal(mask, example.loss_mask.bool())):
        sys.exit(f"example {i} differs from {old}'s: capture {data} from scratch")
print(f"the first {len(done)} examples of {data} are {old}'s, token for token")
if "--check-only" in sys.argv:
    sys.exit(0)
if new.exists():
    sys.exit(f"{new} exists: remove it first")
partial = new.with_name(new.name + ".partial")
shutil.rmtree(partial, ignore_errors=True)
partial.mkdir(parents=True)
for shard in manifest["shards"]:
    shutil.copy2(old / shard["file"], partial / shard["file"])
manifest.update(options={**options, "data": data}, data_sha256=source_digest(data), complete=False, summary=None)
(partial / "manifest.json").write_text(json.dumps(manifest, indent=1))
partial.rename(new)
print(f"seeded {new} with {len(done)} examples ({manifest['tokens']} tokens); `eaglespec capture` resumes there")
