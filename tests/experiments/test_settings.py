"""Every setting of the main job's config and of a training config, given a wrong type or an out-of-range value
by `--set`, is refused in one line with exit 2 before anything is written; right values parse to the field's type."""

import dataclasses
import typing

import pytest

from experiments.pipeline_config import PipelineConfig
from memllm_jax import cli
from memllm_jax.settings import check_tree, field_types, leaf_settings, override
from memllm_jax.train.config import TrainConfig

FREE_TEXT = {"name", "corpus", "eval_corpus", "dev_corpus", "labels", "model", "encoder", "records", "tokenizer",
             "workdir", "init_checkpoint", "compilation_cache", "remat_policy", "train_data", "eval_data"}
"""Text settings that take any value (names, paths: a path's file is checked when the run starts)."""


def _owner_rules(cfg, path: str):
    """The dataclass holding the leaf `path` and the leaf's name."""
    *parents, leaf = path.split(".")
    node = cfg
    for key in parents:
        node = getattr(node, key)
    return type(node), leaf


def _arms(tp):
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType) else (tp,)


def bad_values(cfg, path: str, tp) -> list[tuple[str, str]]:
    """(value text, why) pairs that must be refused for a leaf setting."""
    owner, leaf = _owner_rules(cfg, path)
    bounds, choices = getattr(owner, "BOUNDS", {}).get(leaf), getattr(owner, "CHOICES", {}).get(leaf)
    arms = [a for a in _arms(tp) if a is not type(None)]
    scalar = [typing.get_args(a)[0] if typing.get_origin(a) is tuple else a for a in arms]
    is_tuple = any(typing.get_origin(a) is tuple for a in arms)
    wrap = (lambda v: f"({v},)") if is_tuple else (lambda v: v)
    out = []
    if bool in scalar:
        out.append(("maybe", "type"))
    if int in scalar or float in scalar:
        if str not in scalar:
            out.append(("abc", "type"))
        assert bounds is not None, f"{path}: a number without BOUNDS"
        if bounds == "positive":
            out.append((wrap("0"), "range"))
        elif bounds == "nonnegative":
            out.append((wrap("-1"), "range"))
        elif bounds == "nonpositive":
            out.append((wrap("0.5"), "range"))
        elif bounds == "fraction":
            out.append((wrap("1.5"), "range"))
        else:
            low, high = bounds
            out.append((wrap(repr(low - 1) if low is not None else repr(high + 1)), "range"))
        if float in scalar:
            out.append((wrap("float('nan')") if is_tuple else "nan", "range"))
    if str in scalar and leaf not in FREE_TEXT:
        assert choices is not None, f"{path}: a text setting without CHOICES"
        out.append((wrap("'nonsense'"), "choice"))
    if is_tuple:
        out.append(("[1, 2", "type"))
    if any(dataclasses.is_dataclass(a) for a in arms):  # an optional group that is off, e.g. a full-mode lora
        out.append(("3", "type"))
    assert out, f"{path}: no bad value known for {tp}"
    return out


PIPELINE_CASES = [(path, value) for path, tp in leaf_settings(PipelineConfig()).items()
                  if path.split(".")[-1] not in FREE_TEXT or typing.get_origin(tp) is tuple
                  for value, _ in bad_values(PipelineConfig(), path, tp)]
TRAIN_CASES = [(path, value) for path, tp in leaf_settings(PipelineConfig().mw).items()
               if path.split(".")[-1] not in FREE_TEXT
               for value, _ in bad_values(PipelineConfig().mw, path, tp)]


def test_every_setting_is_covered():
    leaves = leaf_settings(PipelineConfig())
    covered = {p for p, _ in PIPELINE_CASES}
    assert {p for p in leaves if p.split(".")[-1] not in FREE_TEXT} <= covered
    assert len(leaves) > 100  # the whole tree, adapters' model and LoRA settings included


@pytest.mark.slow
@pytest.mark.parametrize("path,value", PIPELINE_CASES)
def test_run_refuses_a_bad_setting_before_writing_anything(path, value, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "--out", str(out), "--set", f"{path}={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: setting ") and path.split(".")[-1] in err, err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("path,value", TRAIN_CASES)
def test_train_refuses_a_bad_setting(path, value, capsys):
    assert cli.main(["train", "--config", "default", "--part", "mw", "--set", f"{path}={value}", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: setting ") and path.split(".")[-1] in err, err


def test_eval_refuses_a_bad_setting(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert cli.main(["eval", "table2", "--out", str(tmp_path / "run"), "--set", "table2.batch=0"]) == 2
    assert "setting table2.batch=0: must be > 0" in capsys.readouterr().err
    assert not list((tmp_path / "run").iterdir())


def test_values_parse_to_the_fields_type():
    cfg = override(PipelineConfig(), "mw.steps=300", "mw.lr=2e-3", "table2.rows=('row7', 'row9')",
                   "write.min_confidence=-0.5", "table2.read_threshold=None", "data.heldout_world=false",
                   "mw.model.matmul_dtype=None", "data.write.counterfactual=1", "name='x y'")
    assert (cfg.mw.steps, cfg.mw.lr, cfg.table2.rows) == (300, 2e-3, ("row7", "row9"))
    assert cfg.write.min_confidence == -0.5 and cfg.table2.read_threshold is None and cfg.data.heldout_world is False
    assert cfg.mw.model.matmul_dtype is None and cfg.data.write.counterfactual == 1 and cfg.name == "x y"
    assert override(cfg, "write.min_confidence=development").write.min_confidence == "development"
    check_tree(cfg)
    assert isinstance(override(PipelineConfig(), "scaling.sizes=(0, 10)").scaling.sizes, tuple)
    assert override(PipelineConfig(), "write.confidence_grid=(-1, -0.5)").write.confidence_grid == (-1.0, -0.5)


def test_print_config_shows_the_resolved_tree(capsys):
    import json

    assert cli.main(["run", "--config", "smollm2_redocred", "--print-config", "--set", "mw.steps=7"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["mw"]["steps"] == 7 and tree["mw"]["seq_len"] == 512 and tree["data"]["write"]["evidence"] is True


def test_rules_across_settings():
    from memllm_jax.errors import InputError

    with pytest.raises(InputError, match="min_confidence='development'.*outside_docs is 0"):
        check_tree(override(PipelineConfig(), "data.outside_docs=0"))
    with pytest.raises(InputError, match="micro_batches=3: must divide global_batch=8"):
        check_tree(override(PipelineConfig(), "mw.micro_batches=3"))
    with pytest.raises(InputError, match="n_kv_heads=2: must divide n_heads=9"):
        check_tree(override(PipelineConfig(), "mw.model.n_kv_heads=2"))


def test_field_types_cover_every_field():
    for cls in (PipelineConfig, TrainConfig):
        assert set(field_types(cls)) == {f.name for f in dataclasses.fields(cls)}


def test_the_rows_a_config_may_name_are_the_rows_defined():
    from experiments.pipeline_config import ROW_KEYS
    from memllm_jax.eval.rows import ROWS

    assert ROW_KEYS == tuple(ROWS)
