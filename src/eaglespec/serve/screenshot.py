"""A screenshot of the chat page (docs/img/chat-page.png): starts the server in-process exactly as
`eaglespec serve` would (the same options; default model SmolLM2 with its shipped head), sends a
prompt through the page in headless Chromium, runs "compare with vanilla", and saves the page.

    python -m eaglespec.serve.screenshot                           # docs/img/chat-page.png
    python -m eaglespec.serve.screenshot --max-batch 1 --out runs/page.png --prompt "Write a haiku"

It needs Playwright (the dev extra) and a Chromium on PATH (Debian's `chromium` package); the
browser Playwright would download is never used. The PNG is saved with a palette of at most
`--colours` colours, to keep the file small.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."
SYSTEM = "You are a helpful assistant."


def find_browser() -> str | None:
    """A Chromium executable on PATH, or None."""
    return next(filter(None, map(shutil.which, BROWSERS)), None)


def capture(url: str, out: Path, prompt: str, max_tokens: int, compare: bool, colours: int,
            browser_path: str, width: int = 1280, height: int = 1180, timeout_s: float = 600) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, headless=True)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(timeout_s * 1000)
        page.goto(url)
        page.wait_for_selector("#model:not(:has-text('connecting'))")
        page.fill("#system", SYSTEM)
        page.fill("#max-tokens", str(max_tokens))
        page.fill("#input", prompt)
        page.click("#send")
        page.wait_for_selector(".reply[data-state=done]")
        if compare:
            page.click("#compare")
            page.wait_for_selector("#comparison[data-state=done]")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()
    _shrink(out, colours)


def _shrink(path: Path, colours: int) -> None:
    from PIL import Image  # matplotlib's dependency

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=colours, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    from ..cli.options import load_generator
    from ..errors import EagleError
    from .app import create_app
    from .cli import config_from_args, register
    from .loadtest import serve_in_thread

    parser = argparse.ArgumentParser(prog="python -m eaglespec.serve.screenshot")
    serve = register(parser.add_subparsers(dest="command"))  # every `eaglespec serve` option
    serve.add_argument("--out", type=Path, default=Path("docs/img/chat-page.png"))
    serve.add_argument("--prompt", default=PROMPT)
    serve.add_argument("--reply-tokens", type=int, default=160, help="the page's max tokens for the reply")
    serve.add_argument("--no-compare", action="store_true", help="leave out 'compare with vanilla'")
    serve.add_argument("--colours", type=int, default=96, help="palette size of the saved PNG")
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    browser = find_browser()
    if browser is None:
        raise EagleError(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}): apt-get install chromium")
    config = config_from_args(args)
    gen = load_generator(args, max_batch=config.max_batch)
    with serve_in_thread(create_app(gen, config)) as url:
        capture(url, args.out, args.prompt, args.reply_tokens, not args.no_compare, args.colours, browser)
    print(f"saved {args.out} ({args.out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
