"""Config: dotted overrides, key-naming errors with suggestions, path resolution, save/load round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mtl_decoder.config import ExperimentConfig, config_from_dict, load_config, load_task
from mtl_decoder.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo.yaml"


def _error(overrides: list[str], path: Path = DEMO) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value


@pytest.mark.parametrize(
    ("override", "key", "suggestion"),
    [
        ("model.d_modle=64", "model.d_modle", "model.d_model"),
        ("training.lrr=0.1", "training.lrr", "training.lr"),
        ("tasks.ner.data.trian=x.jsonl", "tasks.ner.data.trian", "tasks.ner.data.train"),
        ("tasks.ner.columns.tag=t", "tasks.ner.columns.tag", "tasks.ner.columns.tags"),
        ("modle.d_model=64", "modle", "model"),
    ],
)
def test_unknown_key_names_dotted_key_and_suggests_closest(override, key, suggestion):
    err = _error([override])
    assert err.key == key
    assert "unknown key" in str(err)
    assert f"did you mean '{suggestion}'?" in str(err)


def test_unknown_task_in_override_suggests_task_name():
    err = _error(["tasks.nre.data.train=x.jsonl"])
    assert err.key == "tasks.nre"
    assert "'ner'" in str(err)


@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ("model.d_model=abc", "model.d_model", "expected an integer"),
        ("model.d_model=6.5", "model.d_model", "expected an integer"),
        ("model.d_model=0", "model.d_model", "> 0"),
        ("model.n_heads=3", "model.n_heads", "even integer"),
        ("model.dropout=1.5", "model.dropout", "[0, 1)"),
        ("model.initial_shared_weight=1", "model.initial_shared_weight", "between 0 and 1"),
        ("model.ffn=plee", "model.ffn", "did you mean 'ple'"),
        ("training.lr=-1e-3", "training.lr", "> 0"),
        ("training.lr=fast", "training.lr", "expected a number"),
        ("training.lr=nan", "training.lr", "finite"),
        ("training.progress=maybe", "training.progress", "true or false"),
        ("data.sampling=temprature", "data.sampling", "did you mean 'temperature'"),
        ("data.max_length=2", "data.max_length", "at least 4"),
        ("evaluation.position_buckets=[8,4]", "evaluation.position_buckets", "increasing"),
        ("tasks.ner.kind=tagging", "tasks.ner.kind", "did you mean 'token_tagging'"),
        ("tasks.sentiment.primary_metric=f1", "tasks.sentiment.primary_metric", "accuracy"),
        ("balancing.min_weight=3", "balancing.min_weight", "above max_weight"),
    ],
)
def test_bad_value_names_its_key(override, key, fragment):
    err = _error([override])
    assert err.key == key
    assert str(err).startswith(f"config key '{key}':")
    assert fragment in str(err)


def test_overrides_are_typed():
    cfg = load_config(
        DEMO,
        [
            "model.d_model=64",
            "training.lr=1e-3",  # YAML 1.1 reads this as a string: it must still become the float 0.001
            "training.max_steps=1e3",
            "data.group_by_length=false",
            "model.mlp_hidden=null",
            "training.output_dir=runs/x",
            "tasks.sentiment.labels=[neg, pos]",
        ],
    )
    assert cfg.model.d_model == 64 and type(cfg.model.d_model) is int
    assert cfg.training.lr == 0.001 and type(cfg.training.lr) is float
    assert cfg.training.max_steps == 1000 and type(cfg.training.max_steps) is int
    assert cfg.data.group_by_length is False
    assert cfg.model.mlp_hidden is None
    assert cfg.training.output_dir == "runs/x"
    assert cfg.tasks["sentiment"].labels == ["neg", "pos"]


def test_malformed_override_is_a_config_error():
    assert "key=value" in str(_error(["model.d_model"]))


def test_task_override_path_is_relative_to_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(DEMO, ["tasks.ner.data.train=sub/train.jsonl"])
    assert Path(cfg.tasks["ner"].data.train) == (tmp_path / "sub" / "train.jsonl").resolve()
    # the other splits still come from the task file, resolved against the task file's folder
    assert Path(cfg.tasks["ner"].data.validation) == REPO / "tasks/data/conll2003-sample/validation.jsonl"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_task_file_paths_resolve_against_the_task_file(tmp_path, monkeypatch):
    _write(
        tmp_path / "proj/tasks/t.yaml",
        "name: t\nkind: token_tagging\ndata:\n  train: ../data/train.jsonl\n  validation: /abs/dev.jsonl\n",
    )
    cfg_path = _write(tmp_path / "proj/configs/c.yaml", "tasks:\n  - ../tasks/t.yaml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(cfg_path)
    assert Path(cfg.tasks["t"].data.train) == (tmp_path / "proj/data/train.jsonl").resolve()
    assert cfg.tasks["t"].data.validation == "/abs/dev.jsonl"
    assert cfg.tasks["t"].data.test is None
    # inline tasks resolve against the experiment file's folder
    inline = _write(
        tmp_path / "proj/configs/inline.yaml",
        "tasks:\n  - name: s\n    kind: sentence_classification\n    data: {train: d/s.jsonl}\n",
    )
    assert Path(load_config(inline).tasks["s"].data.train) == (tmp_path / "proj/configs/d/s.jsonl").resolve()


def test_hub_split_names_are_not_paths(tmp_path):
    cfg_path = _write(
        tmp_path / "c.yaml",
        "tasks:\n  - {name: h, kind: sentence_classification, data: {hub_id: glue, hub_config: sst2, "
        "train: train, validation: validation}}\n",
    )
    assert load_config(cfg_path).tasks["h"].data.train == "train"


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(DEMO, ["model.d_model=64", "training.lr=1e-3", "model.mlp_hidden=96", "balancing.method=dwa"])
    cfg.save(tmp_path / "config.yaml")
    again = config_from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text(encoding="utf-8")))
    assert isinstance(again, ExperimentConfig)
    assert again == cfg
    assert list(again.tasks) == list(cfg.tasks)


def test_task_file_errors_name_the_task_key(tmp_path):
    _write(tmp_path / "bad.yaml", "name: bad\nkind: tagging\ndata: {train: x.jsonl}\n")
    cfg_path = _write(tmp_path / "c.yaml", "tasks: [bad.yaml]\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg_path)
    assert info.value.key == "tasks.bad.kind"
    assert "did you mean 'token_tagging'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_task(tmp_path / "bad.yaml")
    assert info.value.key == "tasks.bad.kind"
    _write(tmp_path / "nokind.yaml", "name: nokind\ndata: {train: x.jsonl}\n")
    with pytest.raises(ConfigError) as info:
        load_task(tmp_path / "nokind.yaml")
    assert info.value.key == "tasks.nokind.kind" and "required" in str(info.value)


def test_invalid_yaml_names_file_and_line(tmp_path):
    cfg_path = _write(tmp_path / "c.yaml", "model:\n  d_model: 64\n  n_layers: [1\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg_path)
    assert f"{cfg_path}:" in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


def test_missing_task_file_names_the_entry(tmp_path):
    _write(tmp_path / "tasks/t.yaml", "name: t\nkind: token_tagging\ndata: {train: x.jsonl}\n")
    cfg_path = _write(tmp_path / "configs/c.yaml", "tasks:\n  - ../tasks/t.yaml\n  - ../tasks/nope.yaml\n")
    err = _error([], cfg_path)
    assert err.key == "tasks[1]" and "task file not found" in str(err) and "nope.yaml" in str(err)
