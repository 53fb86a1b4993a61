"""A useless head: the 16k head's files with its weights re-initialised (random), so --tree auto
tunes the same tree from the shipped acceptance.json but no draft is ever right."""
import shutil, torch
from pathlib import Path
from eaglespec.draft.head import EagleHead
from eaglespec.engine.target import load_target
src = Path("/work/main/src/eaglespec/heads/smollm2-135m-instruct-16k")
out = Path("/tmp/s35/useless-head")
out.mkdir(parents=True, exist_ok=True)
for f in ("acceptance.json", "draft_vocab.safetensors"):
    shutil.copy(src / f, out / f)
target = load_target(None)
head = EagleHead.from_pretrained(src, target.config)
torch.manual_seed(0)
for p in head.parameters():
    torch.nn.init.normal_(p, std=0.02)
head.save_pretrained(out)
print("saved", sorted(x.name for x in out.iterdir()))
