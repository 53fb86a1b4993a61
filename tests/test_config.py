"""Tree choices and sampling parameters as users type them."""

import json

import pytest

from eaglespec.config import DynamicTreeSpec, SamplingParams, parse_tree
from eaglespec.errors import EagleError


def test_tree_specs():
    assert parse_tree("eagle1").num_nodes == 26
    assert parse_tree("chain:4").depth == 4
    assert parse_tree("dynamic") == DynamicTreeSpec()
    assert parse_tree("dynamic:8,5,30") == DynamicTreeSpec(8, 5, 30)
    assert parse_tree("none") is None


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


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.01), "top_p"), (dict(top_p=float("nan")), "top_p"),
    (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
])
def test_bad_sampling(kwargs, field):
    with pytest.raises(EagleError, match=field):
        SamplingParams(**kwargs)
