"""A useless head: the 16k head's files with its weights re-initialised (random), so --tree auto
tunes the same tree from the shipped acceptance.json but no draft is ever right.
    python make_useless_head.py [OUT]   (default runs/useless-head)"""
import shutil, sys, torch
from pathlib import Path
import eaglespec
from eaglespec.draft.head import EagleHead
from eaglespec.engine.target import load_target
src = Path(eaglespec.__file__).parent / "heads" / "smollm2-135m-instruct-16k"
out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/useless-head")
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
