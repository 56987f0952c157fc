"""Run every benchmark in bench/ and write bench/RESULTS.md.

Each benchmark is a script `bench/<name>.py` that measures ours and its peer side by side, prints
a readable table, and prints as its last line one JSON object with its figures. This runner keeps
each script's table and figures, with the machine they were measured on.

    python bench/run_all.py [NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
# Run only when named: the learning check trains for about half an hour (`make learn`).
ONLY_WHEN_NAMED = {"learn"}


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):  # no /proc/cpuinfo: keep the platform's name
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, {gpu}, Python {platform.python_version()}, torch {torch.__version__}"


def run(script: Path) -> tuple[str, dict | None, int]:
    proc = subprocess.run([sys.executable, str(script)], cwd=BENCH_DIR.parent, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = proc.stdout.rstrip().splitlines()
    figures = None
    with contextlib.suppress(IndexError, json.JSONDecodeError):  # no figures line: the run failed
        figures = json.loads(lines[-1])
        lines = lines[:-1]
    return "\n".join(lines), figures, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    args = parser.parse_args(argv)
    scripts = sorted(p for p in BENCH_DIR.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_"))
    if args.names:
        unknown = set(args.names) - {p.stem for p in scripts}
        if unknown:
            parser.error(f"no such benchmark: {', '.join(sorted(unknown))}; have {[p.stem for p in scripts]}")
        scripts = [p for p in scripts if p.stem in args.names]
    else:
        scripts = [p for p in scripts if p.stem not in ONLY_WHEN_NAMED]
    if not scripts:
        print("bench/ holds no benchmark scripts yet; nothing to run")
        return 0

    sections, failed = [], []
    for script in scripts:
        print(f"== {script.stem}", flush=True)
        table, figures, rc = run(script)
        print(table)
        if rc != 0 or figures is None:
            failed.append(script.stem)
        status = "ok" if rc == 0 and figures is not None else f"FAILED (exit {rc})"
        sections.append(f"## {script.stem} — {status}\n\n```\n{table}\n```\n\nFigures: `{json.dumps(figures)}`\n")

    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = f"# Benchmark results\n\nMeasured {when} on {machine()}.\n\n"
    (BENCH_DIR / "RESULTS.md").write_text(header + "\n".join(sections))
    print(f"wrote {BENCH_DIR / 'RESULTS.md'}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
