"""The chat page at `/` in a real browser: Debian's Chromium, headless, through Playwright (the
system browser: `playwright install` is never run). The page's reply equals the API's greedy
answer, its marks match the stream's per-step counts, Stop ends a stream, a closed tab frees its
slot, reply text with HTML in it stays text, and the API key is asked for and kept in memory only.
Without a browser those tests skip with one line; the route tests run anyway."""

import fnmatch
import tomllib
from collections import Counter
from importlib import resources
from pathlib import Path

import httpx
import pytest
from origin_helpers import drafted_marks, extension, gen, server, stream  # noqa: F401 (gen, server: fixtures)
from serve_helpers import SlowGenerator, live_server, one_torch_thread  # noqa: F401 (autouse fixture)
from test_serve_hardening import wait_until

from eaglespec.serve import ServeConfig, create_app
from eaglespec.serve.page import FILES
from eaglespec.serve.screenshot import find_browser

PROMPT = "Why is the sky blue?"
PIECES = ["<script>window.pwned = 1</script>", '<img src=x onerror="window.pwned = 2">', "<b>bold</b>", " &amp; done"]
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def slow(gen):
    """A server that takes 0.1 s a step and one request at a time: a reply that can be stopped."""
    app = create_app(SlowGenerator(gen, delay=0.1), ServeConfig(max_tokens=400, max_batch=1))
    with live_server(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def browser():
    path = find_browser()
    if path is None:
        pytest.skip("no browser: Chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="no browser driver: pip install playwright (dev extra)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=path, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    tab = browser.new_page()
    tab.set_default_timeout(DEADLINE_S * 1000)
    yield tab
    tab.close()


def busy(url: str) -> bool:
    return httpx.get(url + "/health", timeout=10).json()["busy"]


def send(page, text: str, max_tokens: int) -> None:
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#input", text)
    page.click("#send")


def marks(page, reply: int = 0) -> list[str]:
    """The origin class of each token element of a reply."""
    return page.locator(".reply").nth(reply).evaluate("el => [...el.querySelectorAll('.tok')].map(t => t.classList[1])")


# -- in the browser -----------------------------------------------------------------------------
def test_reply_equals_the_api_and_marks_match_the_steps(server, page):
    page.goto(server)
    page.wait_for_selector("#model:has-text('tiny-llama')")
    send(page, PROMPT, 30)
    page.wait_for_selector(".reply[data-state=done]")
    messages = [{"role": "user", "content": PROMPT}]
    api = httpx.post(server + "/v1/chat/completions", json={"messages": messages, "max_tokens": 30, "temperature": 0},
                     timeout=60).json()
    assert page.text_content(".reply") == api["choices"][0]["message"]["content"]
    chunks = stream(server, {"messages": messages, "max_tokens": 30, "eaglespec": {"token_origin": True}})
    steps = extension(chunks, "steps")
    got = marks(page)
    assert [m == "draft" for m in got] == drafted_marks(steps)
    assert got == [t["origin"] for t in extension(chunks, "tokens")]
    assert {"draft", "bonus", "recovered", "target"} == set(got)
    histogram = page.eval_on_selector_all("#histogram .column", "cs => cs.map(c => [+c.dataset.accepted, +c.dataset.steps])")
    assert {a: n for a, n in histogram if n} == Counter(s["accepted"] for s in steps)
    assert page.text_content("#tau") == f"{chunks[-1]['eaglespec']['tau']:.2f}"
    assert page.text_content("#count") == "30" and page.text_content("#steps") == str(len(steps))
    assert "5 draft nodes, depth 3" in page.text_content("#tree")

    page.click("#compare")  # the same prompt without drafting: the same text
    page.wait_for_selector("#comparison[data-state=done]")
    assert page.get_attribute("#comparison", "data-identical") == "true"
    assert page.text_content("#cmp-identical") == "yes" and page.text_content("#cmp-speedup").endswith("x")

    draft = page.locator(".reply .tok.draft").first
    coloured = draft.evaluate("t => getComputedStyle(t).backgroundColor")
    page.uncheck("#show-origin")  # the legend and the colours switch off
    assert draft.evaluate("t => getComputedStyle(t).backgroundColor") == "rgba(0, 0, 0, 0)" != coloured
    assert not page.is_visible("#legend")


def test_stop_button_ends_the_stream(slow, page):
    url, app = slow
    page.goto(url)
    send(page, PROMPT, 400)
    page.wait_for_function("() => document.querySelectorAll('.reply .tok').length >= 3")
    assert busy(url)
    page.click("#stop")
    page.wait_for_selector(".reply[data-state=stopped]")
    wait_until(lambda: not busy(url), "the worker drops the stopped request")
    assert 3 <= len(marks(page)) < 400 and page.is_enabled("#send")
    send(page, "And then?", 3)  # the conversation goes on, with the stopped part in it
    page.wait_for_selector(".msg:nth-child(4) .reply[data-state=done]")  # you, assistant, you, assistant
    assert len(marks(page, 1)) == 3


def test_a_closed_tab_frees_its_slot(slow, browser):
    """As a disconnected API client (test_serve.py): the worker drops the request at its next
    step and serves the next one at once."""
    url, app = slow
    tab = browser.new_page()
    tab.goto(url)
    send(tab, PROMPT, 400)
    tab.wait_for_function("() => document.querySelectorAll('.reply .tok').length >= 2", timeout=DEADLINE_S * 1000)
    (job,) = app.state.jobs.values()
    assert busy(url)
    tab.close()
    wait_until(job.cancelled.is_set, "the closed tab's request is cancelled")
    wait_until(lambda: not busy(url), "the worker drops the closed tab's request")
    r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 200 and r.json()["eaglespec"]["queue_s"] < 0.5


class HtmlGenerator:
    """Delegates to a generator, but token id i decodes to PIECES[i % len(PIECES)]: HTML tags."""

    def __init__(self, gen):
        self._gen = gen

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def eos_token_ids(self) -> set[int]:
        return set()

    def decode(self, ids: list[int]) -> str:
        return "".join(PIECES[i % len(PIECES)] for i in ids)


def test_reply_html_is_shown_as_text(gen, page):
    with live_server(create_app(HtmlGenerator(gen), ServeConfig(max_tokens=128))) as url:
        page.goto(url)
        typed = "<img src=x onerror=\"window.pwned = 3\">hello"
        send(page, typed, 12)
        page.wait_for_selector(".reply[data-state=done]")
        api = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": typed}], "max_tokens": 12, "temperature": 0}).json()
        reply = api["choices"][0]["message"]["content"]
        assert "<script>" in reply and "<img" in reply  # the greedy reply is made of tags
        assert page.text_content(".reply") == reply
        assert page.text_content(".msg.user .body") == typed
        page.click("#compare")
        page.wait_for_selector("#comparison[data-state=done]")
        assert page.text_content("#cmp-text") == reply
        assert page.locator("#messages script, #messages img, #messages b, #cmp-text *").count() == 0
        assert page.evaluate("() => window.pwned") is None


def test_api_key_is_asked_for_and_kept_in_memory(gen, page):
    with live_server(create_app(gen, ServeConfig(api_key="s3cret", max_tokens=16))) as url:
        page.goto(url)
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key", "wrong")
        page.click("#key-form button")
        page.wait_for_selector("#key-dialog[open] #key-message:has-text('refused')")
        page.fill("#key", "s3cret")
        page.click("#key-form button")
        page.wait_for_selector("#model:has-text('tiny-llama')")
        send(page, PROMPT, 4)
        page.wait_for_selector(".reply[data-state=done]")
        assert len(marks(page)) == 4
        assert page.evaluate("() => [localStorage.length, sessionStorage.length, document.cookie]") == [0, 0, ""]


# -- the page's routes, without a browser --------------------------------------------------------
def test_the_page_and_its_files(server):
    static = resources.files("eaglespec.serve").joinpath("static")
    for path, (name, media_type) in FILES.items():
        r = httpx.get(server + path)
        assert r.status_code == 200 and r.content == static.joinpath(name).read_bytes()
        assert r.headers["content-type"] == media_type
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff"
    html = httpx.get(server + "/").text
    assert "http://" not in html and "https://" not in html  # nothing fetched from elsewhere: it works offline
    assert httpx.get(server + "/static/other.js").status_code == 404


def test_the_page_files_are_package_data():
    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["eaglespec"]
    for name, _ in FILES.values():
        assert any(fnmatch.fnmatch(f"serve/static/{name}", p) for p in patterns), name


def test_a_wrong_key_gets_the_same_401_on_the_page(gen):
    with live_server(create_app(gen, ServeConfig(api_key="s3cret", max_tokens=16))) as url:
        assert httpx.get(url + "/").status_code == 200  # a page load cannot carry the key: the page asks for it
        wrong = {"Authorization": "Bearer nope"}
        page, api = httpx.get(url + "/", headers=wrong), httpx.get(url + "/v1/models", headers=wrong)
        assert page.status_code == api.status_code == 401 and page.json() == api.json()
        assert page.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(url + "/static/chat.js", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_the_page_obeys_allowed_hosts(gen, server):
    for path in ("/", "/static/chat.js"):
        r = httpx.get(server + path, headers={"Host": "evil.example"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    with live_server(create_app(gen, ServeConfig(allowed_hosts=("chat.example",)))) as url:
        assert httpx.get(url + "/", headers={"Host": "chat.example"}).status_code == 200
        assert httpx.get(url + "/", headers={"Host": "localhost"}).status_code == 400
