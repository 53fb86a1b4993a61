"""Tree choices and sampling parameters as users type them."""

import json

import pytest

from eaglespec.core.config import DynamicTreeSpec, SamplingParams, parse_tree
from eaglespec.errors import EagleError


def test_tree_specs():
    assert parse_tree("eagle1").num_nodes == 26
    assert parse_tree("chain:4").depth == 4
    assert parse_tree("dynamic") == DynamicTreeSpec()
    assert parse_tree("dynamic:8,5,30") == DynamicTreeSpec(8, 5, 30)
    assert parse_tree("none") is None


@pytest.mark.parametrize("text", ["dynamic:4,4", "dynamic:4", "dynamic:1,2,3,4"])
def test_a_partial_dynamic_tree_is_refused_with_the_three_number_form(text):
    """dynamic:4,4 used to run silently as dynamic:4,4,12."""
    with pytest.raises(EagleError, match=r"three numbers, dynamic:K,D,N .* e\.g\. dynamic:4,4,12") as info:
        parse_tree(text)
    assert "\n" not in str(info.value)


def test_the_official_eagle2_spelling(capsys):
    """The official EAGLE-2 (total_token T, depth D, top_k K) is our dynamic:K,D+1,T-1: its
    total_token counts the root, its depth the levels after the first. The mapping is printed
    once per spelling, however often the tree is parsed."""
    import eaglespec.core.config as config

    config._note_once.cache_clear()
    assert parse_tree("eagle2:60,5,10") == DynamicTreeSpec(top_k=10, depth=6, total_tokens=59)
    assert parse_tree("eagle2:60,5,10") == DynamicTreeSpec(10, 6, 59)
    assert parse_tree("eagle2:13,3,4") == DynamicTreeSpec(4, 4, 12) == parse_tree("dynamic")
    err = capsys.readouterr().err.splitlines()
    assert err == ["[eaglespec] tree eagle2:60,5,10: official EAGLE-2 total_token=60, depth=5, top_k=10 is our "
                   "dynamic:10,6,59",
                   "[eaglespec] tree eagle2:13,3,4: official EAGLE-2 total_token=13, depth=3, top_k=4 is our "
                   "dynamic:4,4,12"]


@pytest.mark.parametrize("text, says", [("eagle2:60,5", "total_token,depth,top_k"), ("eagle2", "e.g. eagle2:60,5,10"),
                                        ("eagle2:1,5,10", "total_token >= 2"), ("eagle2:a,5,10", "tree")])
def test_bad_official_eagle2_spellings(text, says):
    with pytest.raises(EagleError, match=says) as info:
        parse_tree(text)
    assert "\n" not in str(info.value)


def test_tree_from_a_json_file(tmp_path):
    path = tmp_path / "tree.json"
    path.write_text(json.dumps([[0], [1], [0, 0], [0, 1]]))
    tree = parse_tree(str(path))
    assert tree.num_nodes == 5 and tree.depth == 2
    path.write_text(json.dumps([[0, 0]]))
    with pytest.raises(EagleError, match="not a JSON list of paths"):
        parse_tree(str(path))
    with pytest.raises(EagleError, match="cannot be read"):
        parse_tree(str(tmp_path / "missing.json"))


@pytest.mark.parametrize("text", ["banana", "chain:x", "chain:0", "dynamic:1,2,3,4", "dynamic:0,1,1", "eagle1:3"])
def test_bad_tree_specs(text):
    with pytest.raises(EagleError, match="tree"):
        parse_tree(text)


def test_a_dynamic_tree_must_be_able_to_grow_its_nodes():
    assert parse_tree("dynamic:1,3,3").capacity == 3 and parse_tree("dynamic:2,3,10").capacity == 10
    with pytest.raises(EagleError, match=r"^dynamic tree dynamic:1,2,3: top-k 1 over 2 levels grows at most 2 draft "
                                         r"nodes .*; give N <= 2, or a larger K or D$"):
        parse_tree("dynamic:1,2,3")
    with pytest.raises(EagleError, match="grows at most 10 draft nodes"):
        parse_tree("eagle2:12,2,2")  # the official settings: dynamic:2,3,11


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.01), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
])
def test_bad_sampling(kwargs, field):
    with pytest.raises(EagleError, match=field):
        SamplingParams(**kwargs)


def test_tiny_temperatures_are_greedy_and_seeds_must_fit_a_generator():
    from eaglespec.core.config import SamplingParams

    assert SamplingParams(1e-30).greedy and SamplingParams(0.0).greedy and not SamplingParams(1e-3).greedy
    SamplingParams(1.0, seed=2**64 - 1)
    SamplingParams(1.0, seed=-2**63)
    for seed in (2**64, -2**63 - 1):
        with pytest.raises(EagleError, match="seed must be an integer"):
            SamplingParams(1.0, seed=seed)
