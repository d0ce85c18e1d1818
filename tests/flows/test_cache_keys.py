"""Stage cache keys: each ingredient changes the key, nothing else does, and every process agrees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cache.keys import (
    artifact_key_fingerprints,
    config_slice,
    config_value,
    jsonable,
    key_fingerprint,
    stage_cache_key,
)
from stages.stage import Stage, non_tensor, tensor

FP = {tensor("y"): "f" * 64, non_tensor("uid"): "e" * 64}


def _noop(batch, ctx):
    return batch


def stage(**changes) -> Stage:
    fields = dict(
        name="double",
        version=1,
        requires=(tensor("y"),),
        produces=(tensor("z"),),
        fn=_noop,
        config_keys=("toy.factor",),
    )
    return Stage(**{**fields, **changes})


def test_config_value_reads_pydantic_objects_and_mappings(make_config):
    assert config_value(make_config(factor=3.0), "toy.factor") == 3.0
    assert config_value({"toy": {"factor": 4}}, "toy.factor") == 4
    with pytest.raises(KeyError, match=r"'toy.nope': toy \(ToyConfig\) has no field 'nope'"):
        config_value(make_config(), "toy.nope")
    with pytest.raises(KeyError, match=r"<config root> has no key 'tyo' \(it has \['toy'\]\)"):
        config_value({"toy": {}}, "tyo.factor")


def test_jsonable_is_canonical_and_refuses_objects(make_config):
    assert jsonable(make_config()) == {"toy": {"offset": 1.0, "factor": 2.0, "use_critic": False}}
    assert jsonable({"a": (1, 2), "n": float("nan")}) == {"a": [1, 2], "n": {"float": "nan"}}
    assert jsonable(Path("/x")) == "/x"
    with pytest.raises(TypeError, match=r"config 'toy.f' is a object, which has no canonical"):
        config_slice({"toy": {"f": object()}}, ["toy.f"])


def test_each_ingredient_changes_the_key(make_config):
    base = stage_cache_key(stage(), make_config(), FP)
    assert len(base) == 64 and base == stage_cache_key(stage(), make_config(), dict(FP))
    assert stage_cache_key(stage(version=2), make_config(), FP) != base
    assert stage_cache_key(stage(name="other"), make_config(), FP) != base
    assert stage_cache_key(stage(), make_config(factor=3.0), FP) != base
    assert stage_cache_key(stage(), make_config(), {**FP, tensor("y"): "0" * 64}) != base
    weighted = stage(reads_weights=True)
    assert stage_cache_key(weighted, make_config(), FP, "w1") != stage_cache_key(
        weighted, make_config(), FP, "w2"
    )


def test_values_the_stage_does_not_read_leave_the_key_alone(make_config):
    base = stage_cache_key(stage(), make_config(), FP)
    assert stage_cache_key(stage(), make_config(offset=9.0, use_critic=True), FP) == base
    assert stage_cache_key(stage(), make_config(), {tensor("y"): FP[tensor("y")]}) == base
    # the function object is not part of the key: only name, version, config, inputs, weights
    assert stage_cache_key(stage(fn=lambda b, c: b), make_config(), FP) == base


def test_missing_fingerprints_and_weights_are_errors(make_config):
    with pytest.raises(
        KeyError, match=r"stage 'double': no fingerprint for required keys \['batch.y'\]"
    ):
        stage_cache_key(stage(), make_config(), {})
    with pytest.raises(ValueError, match=r"stage 'double' reads weights.*got None"):
        stage_cache_key(stage(reads_weights=True), make_config(), FP)
    with pytest.raises(ValueError, match=r"declares reads_weights=False but got a weights"):
        stage_cache_key(stage(), make_config(), FP, "w")


def test_key_fingerprints_depend_on_artifact_and_key():
    keys = artifact_key_fingerprints("a" * 64, [tensor("y"), non_tensor("y")])
    assert len(set(keys.values())) == 2  # same name, different layer
    assert key_fingerprint("b" * 64, tensor("y")) != keys[tensor("y")]


SUBPROCESS = """
import json, sys
from pydantic import BaseModel
from flows.cache.keys import key_fingerprint, stage_cache_key
from stages.stage import Stage, non_tensor, tensor

class Toy(BaseModel):
    factor: float = 2.0
    tags: tuple[str, ...] = ("b", "a")

class Cfg(BaseModel):
    toy: Toy = Toy()

stage = Stage("double", 1, (tensor("y"), non_tensor("uid")), (tensor("z"),), lambda b, c: b,
              config_keys=("toy.factor", "toy.tags"), reads_weights=True)
fps = {non_tensor("uid"): key_fingerprint("e" * 64, non_tensor("uid")),
       tensor("y"): key_fingerprint("f" * 64, tensor("y"))}
print(json.dumps(stage_cache_key(stage, Cfg(), fps, "weights-1")))
"""


def test_cache_key_is_the_same_in_another_process():
    """Same inputs in a fresh interpreter (other hash seed, other dict order) → same key."""
    out = subprocess.run(
        [sys.executable, "-c", SUBPROCESS],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        cwd=Path(__file__).resolve().parents[2],
    )
    other_process = json.loads(out.stdout.strip().splitlines()[-1])
    namespace: dict = {}
    exec(SUBPROCESS.replace("print(json.dumps(", "result = (("), namespace)
    assert other_process == namespace["result"]
