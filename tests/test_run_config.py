"""agentgrad.config: settings dataclasses from YAML/TOML files and flags (defaults < file < flags)."""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from agentgrad.config import (
    ConfigError,
    add_dataclass_arguments,
    config_fields,
    dump,
    field_docs,
    from_dict,
    load_file,
    resolve,
)
from agentgrad.errors import InvalidInputError


@dataclass
class Optim:
    lr: float = 1e-3
    """Learning rate."""
    betas: tuple[float, float] = (0.9, 0.99)
    """Adam's betas."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule (100 % of lr at the start)."""
    warmup: int | None = None
    """Warm-up steps (none: no warm-up)."""


@dataclass
class Lora:
    r: int = 16
    """Rank of the adapters."""
    targets: list[str] = field(default_factory=lambda: ["q", "v"])
    """Modules that get adapters."""


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Run:
    steps: int = 20
    """Optimizer steps.

    A second paragraph that --help leaves out."""
    name: str = "run"
    """Run name."""
    resume: bool = True
    """Continue from the last checkpoint."""
    tags: tuple[str, ...] = ()
    """Free-form tags."""
    output_dir: str | Path = "runs/x"
    """Where outputs go."""
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0})
    """Sampling settings."""
    color: Color = Color.RED
    """A colour."""
    optim: Optim = field(default_factory=lambda: Optim(lr=5e-4))
    """Optimizer settings."""
    lora: Lora | None = None
    """LoRA adapters (none: full fine-tuning)."""

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be ≥ 0, got {self.steps}")


@dataclass
class Needs:
    model: str
    """The model (required)."""
    steps: int = 1


RUN_YAML = """\
steps: 5
name: first
tags: [a, b]
optim:
  warmup: 10
"""

RUN_TOML = """\
steps = 5
name = "first"
tags = ["a", "b"]

[optim]
warmup = 10
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def parse(cls: type, argv: list[str], prefix: str = "") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train")
    parser.add_argument("--config")
    add_dataclass_arguments(parser, cls, prefix)
    return parser.parse_args(argv)


def error(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        resolve(*args, **kwargs)
    return str(info.value)


# ---- files ---------------------------------------------------------------------------------------


def test_defaults_alone():
    assert resolve(Run) == Run()


@pytest.mark.parametrize(("name", "text"), [("run.yaml", RUN_YAML), ("run.yml", RUN_YAML), ("run.toml", RUN_TOML)])
def test_a_file_over_the_defaults(tmp_path, name, text):
    config = resolve(Run, file=write(tmp_path / name, text))
    assert (config.steps, config.name, config.tags) == (5, "first", ("a", "b"))
    # a section set in part keeps the rest of its default, the default factory's lr included
    assert config.optim == Optim(lr=5e-4, warmup=10)
    assert config.resume is True and config.lora is None


def test_an_empty_yaml_file_is_the_defaults(tmp_path):
    assert resolve(Run, file=write(tmp_path / "run.yaml", "# nothing set\n")) == Run()


def test_values_converted_where_the_intent_is_plain(tmp_path):
    path = write(
        tmp_path / "run.yaml",
        """\
steps: 10.0          # an integral float is an integer
name: "7"
resume: "off"        # a string naming a boolean
output_dir: out/a    # str | Path: a string stays a string
color: blue
optim:
  lr: 5e-4           # YAML 1.1 reads this as a string
  betas: [0.8, 1]    # a list is a tuple, an integer a float
  warmup: "12"
lora: {}             # a section that may be None: present, with its defaults
""",
    )
    config = resolve(Run, file=path)
    assert (config.steps, config.name, config.resume, config.output_dir, config.color) == (
        10,
        "7",
        False,
        "out/a",
        Color.BLUE,
    )
    assert config.optim == Optim(lr=5e-4, betas=(0.8, 1.0), warmup=12)
    assert isinstance(config.optim.betas[1], float) and config.lora == Lora()


def test_unknown_key_names_file_key_path_and_valid_keys(tmp_path):
    path = write(tmp_path / "run.yaml", "stepz: 5\n")
    message = error(Run, file=path)
    assert message.startswith(f"{path}: unknown key 'stepz'; did you mean 'steps'?")
    assert "valid keys: steps, name, resume, tags, output_dir, sampling, color, optim, lora" in message

    path = write(tmp_path / "nested.toml", "[optim]\nlrr = 0.1\n")
    message = error(Run, file=path)
    assert f"{path}: unknown key 'optim.lrr'; did you mean 'lr'?" in message
    assert "valid keys under optim: lr, betas, schedule, warmup" in message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("steps: many", "steps: expected an integer, got 'many'"),
        ("steps: 2.5", "steps: expected an integer, got 2.5"),
        ("steps: true", "steps: expected an integer, got True"),
        ("resume: 3", "resume: expected true or false, got 3"),
        ("name: 7", "name: expected a string, got 7 (quote it to make it a string)"),
        ("tags: a", "tags: expected a list, each item a string, got 'a'"),
        ("color: green", "color: expected one of 'red', 'blue', got 'green'"),
        ("sampling: [1]", "sampling: expected a mapping, got [1]"),
        ("optim: 3", "optim: expected an Optim section (a mapping), got 3"),
        ("optim: {schedule: linear}", "optim.schedule: expected one of 'constant', 'cosine', got 'linear'"),
        ("optim: {betas: [0.9]}", "optim.betas: expected a list of 2 (a number, a number), got [0.9]"),
        ("optim: {warmup: soon}", "optim.warmup: expected an integer or null, got 'soon'"),
        ("optim: {lr: null}", "optim.lr: expected a number, got None"),
    ],
)
def test_a_value_of_the_wrong_type_names_key_type_and_value(tmp_path, text, needle):
    path = write(tmp_path / "run.yaml", text + "\n")
    assert error(Run, file=path) == f"{path}: {needle}"


def test_the_class_own_checks_name_the_file(tmp_path):
    path = write(tmp_path / "run.yaml", "steps: -1\n")
    assert error(Run, file=path) == f"{path}: steps must be ≥ 0, got -1"


def test_a_required_setting_missing(tmp_path):
    assert "missing required setting(s) model" in error(Needs)
    assert resolve(Needs, file=write(tmp_path / "n.yaml", "model: tiny\n")) == Needs(model="tiny")


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("run.ini", "steps = 1", "unknown format (use .yaml, .yml, .toml or .json)"),
        ("run.yaml", "steps: 1\noptim: [\n", "not YAML"),
        ("run.yaml", "steps: 1\nname: a\nsteps: 2\n", ":3: not YAML (key 'steps' given twice)"),
        ("run.toml", "steps = \n", "not TOML"),
        ("run.json", '{"steps": }', ":1: not JSON"),
        ("run.yaml", "- steps\n", "a config file holds a mapping of settings, got list"),
    ],
    ids=["unknown-format", "bad-yaml", "duplicate-key", "bad-toml", "bad-json", "not-a-mapping"],
)
def test_a_file_that_cannot_be_read_names_itself(tmp_path, name, text, needle):
    path = write(tmp_path / name, text)
    message = error(Run, file=path)
    assert message.startswith((str(path), f"config file {path}")), message
    assert needle in message


def test_a_missing_file(tmp_path):
    assert "cannot read config file" in error(Run, file=tmp_path / "nope.yaml")


def test_config_errors_are_invalid_input():
    assert issubclass(ConfigError, InvalidInputError)


def test_from_dict_checks_like_a_file():
    assert from_dict(Run, {"optim": {"lr": "1e-4"}}).optim == Optim(lr=1e-4)
    with pytest.raises(ConfigError, match="settings: unknown key 'optim.lrr'"):
        from_dict(Run, {"optim": {"lrr": 1}})


def test_load_file_returns_the_raw_mapping(tmp_path):
    assert load_file(write(tmp_path / "run.toml", RUN_TOML)) == {
        "steps": 5,
        "name": "first",
        "tags": ["a", "b"],
        "optim": {"warmup": 10},
    }


# ---- flags ---------------------------------------------------------------------------------------


def test_flags_over_the_file_over_the_defaults(tmp_path):
    path = write(tmp_path / "run.yaml", RUN_YAML)
    args = parse(Run, ["--config", str(path), "--steps", "7", "--optim.lr", "1e-4", "--no-resume"])
    config = resolve(Run, file=args.config, args=args)
    assert (config.steps, config.name, config.resume, config.tags) == (7, "first", False, ("a", "b"))
    assert config.optim == Optim(lr=1e-4, warmup=10)  # the flag and the file share the section


def test_flags_that_are_not_given_leave_the_file_alone(tmp_path):
    path = write(tmp_path / "run.yaml", RUN_YAML)
    args = parse(Run, ["--config", str(path)])
    assert not hasattr(args, "steps")
    assert resolve(Run, file=path, args=args) == resolve(Run, file=path)


def test_a_flag_replaces_a_mapping_setting_whole(tmp_path):
    path = write(tmp_path / "run.yaml", "sampling: {temperature: 0.7}\n")
    config = resolve(Run, file=path, args=parse(Run, ["--sampling", "{top_p: 0.9}"]))
    assert config.sampling == {"top_p": 0.9}


def test_every_kind_of_flag():
    args = parse(
        Run,
        [
            "--name",
            "b",
            "--tags",
            "x,y",
            "--output_dir",
            "out",  # the underscore spelling works too
            "--sampling",
            "{temperature: 0.5, top_p: 0.9}",
            "--color",
            "blue",
            "--resume",
            "--optim.betas",
            "[0.8, 0.95]",
            "--optim.schedule",
            "cosine",
            "--optim.warmup",
            "none",
            "--lora.r",
            "8",
            "--lora.targets",
            "k",
        ],
    )
    config = resolve(Run, args=args)
    assert (config.name, config.tags, config.output_dir, config.color, config.resume) == (
        "b",
        ("x", "y"),
        "out",
        Color.BLUE,
        True,
    )
    assert config.sampling == {"temperature": 0.5, "top_p": 0.9}
    assert config.optim == Optim(lr=5e-4, betas=(0.8, 0.95), schedule="cosine", warmup=None)
    assert config.lora == Lora(r=8, targets=["k"])  # a section that was None, made from its defaults


def test_a_section_that_may_be_none_is_set_whole_by_its_own_flag(tmp_path):
    path = write(tmp_path / "run.yaml", "lora: {r: 4}\n")
    assert resolve(Run, file=path).lora == Lora(r=4)
    assert resolve(Run, file=path, args=parse(Run, ["--lora", "none"])).lora is None
    assert resolve(Run, args=parse(Run, ["--lora", "{}"])).lora == Lora()
    assert resolve(Run, file=path, args=parse(Run, ["--lora.targets", "a,b"])).lora == Lora(r=4, targets=["a", "b"])
    both = parse(Run, ["--lora.targets", "a", "--lora", "{r: 2}"])  # the section first, whatever the order
    assert resolve(Run, args=both).lora == Lora(r=2, targets=["a"])
    with pytest.raises(ConfigError, match="--lora.r sets a key inside lora, which was set whole"):
        resolve(Run, args=parse(Run, ["--lora", "none", "--lora.r", "3"]))


def test_a_bad_flag_is_a_usage_error_naming_it(capsys):
    with pytest.raises(SystemExit) as info:
        parse(Run, ["--optim.warmup", "soon"])
    assert info.value.code == 2
    assert "argument --optim.warmup: expected an integer or null, got 'soon'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(Run, ["--optim.schedule", "linear"])
    assert "expected one of 'constant', 'cosine', got 'linear'" in capsys.readouterr().err


def test_help_shows_each_docstring_and_default():
    parser = argparse.ArgumentParser(prog="train")
    add_dataclass_arguments(parser, Run)
    text = " ".join(parser.format_help().split())
    assert "--steps INT Optimizer steps. (default: 20)" in text
    assert "second paragraph" not in text
    assert "--optim.lr FLOAT Learning rate. (default: 0.0005)" in text  # the section's default factory
    assert "--optim.schedule {constant,cosine} Learning-rate schedule (100 % of lr at the start)." in text
    assert "--resume, --no-resume Continue from the last checkpoint. (default: true)" in text
    assert "--output-dir TEXT Where outputs go. (default: runs/x)" in text
    assert "--output_dir" not in text  # the underscore spelling is accepted, not listed
    assert "--lora none|{K: V} LoRA adapters (none: full fine-tuning). (default: none)" in text
    assert "--lora.r INT Rank of the adapters. (default: 16)" in text
    assert "Run settings: optim" in text


def test_help_of_a_required_setting():
    parser = argparse.ArgumentParser(prog="x")
    add_dataclass_arguments(parser, Needs)
    assert "The model (required). (required)" in " ".join(parser.format_help().split())


def test_a_prefix_names_the_flags_and_keeps_other_arguments_out():
    parser = argparse.ArgumentParser(prog="train")
    parser.add_argument("--steps", type=int, default=99)  # the command's own flag of the same name
    add_dataclass_arguments(parser, Run, prefix="run.")
    args = parser.parse_args(["--steps", "3", "--run.steps", "4", "--run.optim.lr", "0.1"])
    config = resolve(Run, args=args, prefix="run.")
    assert (args.steps, config.steps, config.optim.lr) == (3, 4, 0.1)


def test_a_mapping_of_overrides():
    config = resolve(Run, args={"optim.lr": "1e-4", "steps": 3, "lora": {"r": 2}, "tags": "a,b"})
    assert (config.optim.lr, config.steps, config.lora, config.tags) == (1e-4, 3, Lora(r=2), ("a", "b"))
    with pytest.raises(ConfigError, match=r"flags: unknown key '--optim.lrr'; did you mean 'lr'\?"):
        resolve(Run, args={"optim.lrr": 1})
    with pytest.raises(ConfigError, match="--steps is a setting, not a section"):
        resolve(Run, args={"steps.x": 1})
    with pytest.raises(ConfigError, match="flags: --steps: expected an integer, got 'many'"):
        resolve(Run, args={"steps": "many"})


def test_config_fields_flatten_sections():
    paths = [(f.path, f.section) for f in config_fields(Run)]
    assert paths[:6] == [
        ("steps", False),
        ("name", False),
        ("resume", False),
        ("tags", False),
        ("output_dir", False),
        ("sampling", False),
    ]
    assert ("optim.lr", False) in paths and ("lora", True) in paths and ("lora.targets", False) in paths
    lr = next(f for f in config_fields(Run) if f.path == "optim.lr")
    assert (lr.type, lr.default, lr.doc) == (float, 5e-4, "Learning rate.")


def test_field_docs_reads_attribute_docstrings():
    assert field_docs(Optim)["lr"] == "Learning rate."


# ---- dump ----------------------------------------------------------------------------------------


def test_dump_writes_what_resolve_reads_back(tmp_path):
    config = Run(
        steps=3,
        name="yes",
        tags=("a b", "c"),
        output_dir=Path("out/x"),
        color=Color.BLUE,
        sampling={"temperature": 0.7, "stop": ["\n"]},
        optim=Optim(lr=1e-5, betas=(0.8, 0.9), warmup=2),
        lora=Lora(r=4),
    )
    path = dump(config, tmp_path / "run" / "config.yaml")
    text = path.read_text()
    assert "# Optimizer steps.\nsteps: 3\n" in text and "  # Learning rate.\n  lr: 1.0e-05\n" in text
    assert "second paragraph" not in text
    raw = yaml.safe_load(text)  # plain YAML, readable by anyone: a float is a float, "yes" a string
    assert raw["optim"]["lr"] == 1e-5 and raw["name"] == "yes" and raw["output_dir"] == "out/x"
    back = resolve(Run, file=path)
    assert back == Run(
        steps=3,
        name="yes",
        tags=("a b", "c"),
        output_dir="out/x",
        color=Color.BLUE,
        sampling={"temperature": 0.7, "stop": ["\n"]},
        optim=Optim(lr=1e-5, betas=(0.8, 0.9), warmup=2),
        lora=Lora(r=4),
    )


def test_dump_of_a_multiline_string(tmp_path):
    config = Run(name="two\nlines: 'quoted' \"both\"")
    assert resolve(Run, file=dump(config, tmp_path / "c.yaml")) == config


# ---- GRPOConfig ----------------------------------------------------------------------------------


def test_grpo_config_from_a_yaml_file_and_flags(tmp_path):
    grpo = pytest.importorskip("agentgrad.algorithms.grpo")
    GRPOConfig = grpo.GRPOConfig
    path = write(
        tmp_path / "run.yaml",
        """\
steps: 30
group_size: 4
estimator: reinforce++
train:
  lr: 5e-4
  betas: [0.9, 0.95]
""",
    )
    args = parse(
        GRPOConfig, ["--config", str(path), "--batch-size", "2", "--train.kl-coef", "0.01", "--train.lora", "{r: 8}"]
    )
    config = resolve(GRPOConfig, file=args.config, args=args)
    assert (config.steps, config.group_size, config.batch_size, config.estimator) == (30, 4, 2, "reinforce++")
    assert (config.train.lr, config.train.betas, config.train.kl_coef) == (5e-4, (0.9, 0.95), 0.01)
    assert config.train.lora is not None and config.train.lora.r == 8
    assert resolve(GRPOConfig, file=dump(config, tmp_path / "resolved.yaml")) == config
    with pytest.raises(ConfigError, match=r"unknown key 'train.learning_rate'.*valid keys under train: lr,"):
        resolve(GRPOConfig, file=write(tmp_path / "bad.yaml", "train:\n  learning_rate: 1e-4\n"))
