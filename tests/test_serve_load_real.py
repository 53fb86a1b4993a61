"""The server's load test on the real default model (issue #10): see eaglespec.serve.loadtest.
Its own module, so that the model runs on every core (the tiny-model server tests pin one thread)."""

import pytest

from eaglespec.serve import ServeConfig, create_app
from eaglespec.serve.loadtest import serve_in_thread


@pytest.mark.slow
def test_openai_clients_on_the_default_model_with_default_settings():
    """Issue #10's load test: 32 concurrent `openai` clients x 2 requests (mixed streaming / not,
    chat / completions, greedy, max_tokens 16) against the default model and head with the
    server's default settings (continuous batching): no errors, and every text equals the same
    request sent alone. Loopback only; the clients' own timeout bounds it."""
    from eaglespec.engine.decoding import EagleGenerator
    from eaglespec.serve.loadtest import run

    config = ServeConfig()
    gen = EagleGenerator.from_pretrained(None, "default", "auto", max_batch=config.max_batch)
    with serve_in_thread(create_app(gen, config)) as url:
        report = run(url, clients=32, per_client=2, max_tokens=16, timeout=600)
    assert report.errors == 0, report.first_error
    assert report.mismatches == 0
    assert report.requests == 64 and report.tokens_per_s > 0
