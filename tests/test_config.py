"""Every stage's config composes with every option of every group it uses."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import conf
from conf import schema


def _stage_defaults(stage: str) -> dict[str, str]:
    """The groups named in a stage's defaults list, each with its default option."""
    defaults = OmegaConf.load(schema.CONF_DIR / f"{stage}.yaml")["defaults"]
    return {next(iter(d)): next(iter(d.values())) for d in defaults
            if not isinstance(d, str) and not next(iter(d)).startswith("override ")}


def _stage_groups(stage: str) -> list[str]:
    return list(_stage_defaults(stage))


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (schema.CONF_DIR / group).glob("*.yaml"))


CASES = [(stage, group, option) for stage in schema.STAGES
         for group in _stage_groups(stage) for option in _options(group)]


def test_every_group_has_a_schema_and_options():
    used = {g for s in schema.STAGES for g in _stage_groups(s)}
    assert used == set(schema.GROUP_SCHEMAS) | set(schema.OPTION_SCHEMAS)
    for group, options in schema.OPTION_SCHEMAS.items():
        assert set(_options(group)) == set(options), group
    assert len(CASES) >= 30


@pytest.mark.parametrize(("stage", "group", "option"), CASES)
def test_stage_composes_with_option(stage, group, option):
    cfg = conf.compose(stage, [f"{group}={option}"])
    node = OmegaConf.to_container(cfg[group], resolve=True, throw_on_missing=False)
    option_schemas = schema.OPTION_SCHEMAS.get(group)
    if option_schemas:
        assert node["name"] == option
        assert OmegaConf.get_type(cfg[group]) is option_schemas[option]
    else:
        assert OmegaConf.get_type(cfg[group]) is schema.GROUP_SCHEMAS[group]


def test_parallel_degrees_and_model_shapes_are_consistent():
    for option in _options("parallel"):
        p = conf.compose("train", [f"parallel={option}"]).parallel
        assert p.cp_kind in {"ulysses", "ring", "hybrid"}
        assert min(p.dp_replicate, p.dp_shard, p.cp, p.tp) >= 1
    for option in _options("model"):
        m = conf.compose("train", [f"model={option}"]).model
        assert m.flavor == option
        assert m.hidden_size % m.num_heads == 0


def test_required_paths_are_missing_not_guessed():
    cfg = conf.compose("curate")
    assert OmegaConf.is_missing(cfg, "input") and OmegaConf.is_missing(cfg, "output")
    cfg = conf.compose("curate", ["input=videos/", "output=out/", "clips.max_s=4"])
    assert cfg.input == "videos/" and cfg.clips.max_s == 4.0


def test_bad_overrides_fail_with_messages_that_name_the_problem():
    with pytest.raises(ConfigCompositionException, match="detector") as raised:
        conf.compose("curate", ["detector=no_such_detector"])
    # The options to choose from, and no schema among them (`_adaptive` was listed beside `adaptive`).
    listed = str(raised.value).split("Available options in 'detector':")[1].split("Config search path")[0].split()
    assert listed == _options("detector")
    with pytest.raises(ConfigCompositionException, match="clips.max_s"):
        conf.compose("curate", ["clips.max_s=ten"])
    with pytest.raises(ConfigCompositionException, match="no_such_key"):
        conf.compose("curate", ["no_such_key=1"])
    with pytest.raises(ValueError, match="unknown stage"):
        conf.compose("cook")


@pytest.mark.parametrize("command, given, said", [
    ("vfm-curate", [], "vfm-curate: input= and output= must be given. Usage: vfm-curate input=<videos> output=<dir>"),
    ("vfm-train", ["run_dir=r"], "vfm-train: data.shards= must be given. Usage: vfm-train run_dir=<dir> "
                                 "data.shards=<curated dir>"),
    ("vfm-encode", ["input=i"], "vfm-encode: output= must be given. Usage: vfm-encode input="),
    ("vfm-sample", ["checkpoint=c"], "vfm-sample: prompt= and output= must be given. Usage: vfm-sample checkpoint="),
    ("vfm-serve", [], "vfm-serve: checkpoint= must be given. Usage: vfm-serve checkpoint=<exported dir>"),
])
def test_a_command_without_what_it_needs_says_so_in_one_line(command, given, said, tmp_path, without_torch):
    """A new user's first try, `vfm-curate` alone, ended in OmegaConf's MissingMandatoryValue traceback.
    Each command says so before it imports torch (seconds): here a `torch` that cannot be imported
    comes first on the path. vfm-encode, vfm-sample and vfm-serve imported it first (4 s each), and
    failed on it here."""
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run([str(Path(sys.executable).parent / command), *given], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env=without_torch)
    assert r.returncode == 2 and r.stderr.startswith(said), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]


@pytest.mark.parametrize("stage", ["curate", "encode"])
def test_a_commands_help_lists_its_usage_and_the_options_of_its_own_groups(stage, tmp_path):
    """`vfm-curate --help` listed every stage's groups (model, parallel, server, ...) and the schemas
    among the options (`detector: _adaptive, _fixed, _transnetv2, adaptive, ...`), under "cli is
    powered by Hydra"."""
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run([str(Path(sys.executable).parent / f"vfm-{stage}"), "--help"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    head, config = r.stdout.split("== Config ==")
    assert head.startswith(f"Usage: {conf.USAGE[stage]}\n"), head
    defaults = _stage_defaults(stage)
    listed = {line.split(": ")[0]: line.split(": ")[1].split(", ") for line in head.splitlines() if ": " in line
              and not line.startswith("Usage")}
    assert listed == {g: [f"{o}*" if o == defaults[g] else o for o in _options(g)] for g in _stage_groups(stage)}
    assert "_schema" not in r.stdout and "_adaptive" not in r.stdout and "Hydra" not in head
    assert "\ninput: ???" in config and "--hydra-help" in config
