"""The commands the README tells a new user to type exist and do what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import import_module
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

README = (REPO / "README.md").read_text()


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120)


def test_quickstart_is_exactly_the_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make smoke", "make test"]


def test_every_make_target_in_the_readme_is_documented_and_runs_dry():
    targets = set(re.findall(r"`make (\w+)", README)) | set(re.findall(r"^make (\w+)", README, re.M))
    assert {"smoke", "test", "setup", "lint", "bench", "clean", "help"} <= targets
    helped = _make("help").stdout
    for target in targets:
        assert f"make {target}" in helped, f"`make help` does not list {target}"
        dry = _make("-n", target)
        assert dry.returncode == 0, dry.stderr


def test_setup_installs_torch_first_from_the_pinned_variable():
    dry = _make("-n", "-B", "setup", "TORCH=torch==9.9.9").stdout.splitlines()
    installs = [line for line in dry if "pip install" in line and "--upgrade pip" not in line]
    assert installs[0].endswith("install --quiet torch==9.9.9")
    assert "-e '.[dev]'" in installs[1] and installs[1].endswith("torch==9.9.9")


def test_python_modules_in_the_readme_run():
    modules = set(re.findall(r"python -m ([\w.]+)", README))
    assert "curator.synth" in modules
    for module in modules:
        proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                              cwd=REPO, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "usage" in proc.stdout.lower()


def test_console_scripts_in_the_readme_are_registered():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("scripts", {})
    for name in set(re.findall(r"\b(vfm-[a-z]+)\b", README)):
        assert name in scripts, f"README names {name} but pyproject.toml does not register it"
    for target in scripts.values():
        module, func = target.split(":")
        assert callable(getattr(import_module(module), func))


def _ci(pytest_args: str) -> subprocess.CompletedProcess:
    # Without the make variables of a `make test PYTEST_ARGS=...` this suite may run under: a
    # variable given on make's command line reaches the inner make through MAKEFLAGS and overrides
    # the environment's, and the inner run took the outer one's arguments (the whole suite, past
    # the timeout).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["PYTEST_ARGS"] = pytest_args
    return subprocess.run(["bash", str(REPO / ".ci" / "run")], capture_output=True, text=True, env=env,
                          timeout=300)


def test_ci_passes_on_passing_tests_and_fails_on_failing_or_no_tests(tmp_path):
    assert _ci("tests/test_synth.py -k odd_size").returncode == 0
    assert _ci("tests/test_synth.py -k no_test_has_this_name").returncode != 0  # pytest's exit 5
    failing = tmp_path / "test_fails.py"
    failing.write_text("def test_fails():\n    assert 1 == 2\n")
    assert _ci(f"{failing} -p no:cacheprovider").returncode != 0
