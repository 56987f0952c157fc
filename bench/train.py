"""Training throughput: `vfm-train` on curated real footage (bikes, bigbuckbunny and PySceneDetect's
clips when present), the debug and ~130M flavors, on one process (all cores) and on 2 processes
with context parallelism (cp=2, Ulysses; one core each), side by side in one run.

Figures per layout, medians over the steps after the first two (warm-up): samples/s, tokens/s,
MFU (model FLOPs over the peak a measured fp32 matmul reaches on these cores), the fraction of the
step spent waiting for data, and peak memory per process.

    python bench/train.py [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from loader import curate_corpus

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BUCKETS = "[[8,32,56],[8,56,32],[8,32,32]]"
TOKENS = 8 * 16 * 28  # one 8x32x56 clip per batch at the debug patch (1x2x2 pixels per token)
LAYOUTS = [("debug", 1, "single"), ("debug", 2, "cp2_ulysses"), ("dit_130m", 1, "single"),
           ("dit_130m", 2, "cp2_ulysses")]


def train(curated: Path, run_dir: Path, flavor: str, nproc: int, parallel: str, steps: int) -> dict:
    args = [f"run_dir={run_dir}", f"data.shards={curated}", f"model={flavor}", f"parallel={parallel}",
            f"num_steps={steps}", f"data.buckets={BUCKETS}", f"data.tokens_per_batch={TOKENS}", "data.num_workers=1",
            "checkpoint.every_steps=100000"]
    launcher = [sys.executable, "-m", "train"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "train"]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // nproc))}
    r = subprocess.run(launcher + args, cwd=REPO, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"vfm-train {flavor} {parallel} failed:\n{r.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][2:]
    return {key: statistics.median(r[key] for r in records)
            for key in ("samples_per_s", "tokens_per_s", "mfu", "data_wait", "step_s", "peak_mem_mib")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="steps per layout; the first two are warm-up")
    args = parser.parse_args()
    rows, figures = [], {}
    with tempfile.TemporaryDirectory(prefix="vfm-bench-train-") as tmp:
        tmp = Path(tmp)
        curated = curate_corpus(tmp)
        for flavor, nproc, parallel in LAYOUTS:
            m = train(curated, tmp / f"{flavor}-{parallel}", flavor, nproc, parallel, args.steps)
            rows.append((flavor, nproc, parallel, m))
            tag = f"{flavor}_{parallel}"
            figures[f"mfu_{tag}"] = round(m["mfu"], 4)
            figures[f"samples_per_s_{tag}"] = round(m["samples_per_s"], 3)
            figures[f"data_wait_{tag}"] = round(m["data_wait"], 4)
    print(f"{os.cpu_count()} CPU cores, fp32; {TOKENS} tokens per step (one 8x32x56 clip); medians of steps "
          f"3..{args.steps}")
    print(f"{'flavor':9s} {'procs':>5s} {'layout':12s} {'samples/s':>9s} {'tokens/s':>9s} {'MFU':>6s} "
          f"{'data wait':>9s} {'step s':>7s} {'peak MiB':>9s}")
    for flavor, nproc, parallel, m in rows:
        print(f"{flavor:9s} {nproc:5d} {parallel:12s} {m['samples_per_s']:9.2f} {m['tokens_per_s']:9.0f} "
              f"{100 * m['mfu']:5.1f}% {100 * m['data_wait']:8.1f}% {m['step_s']:7.2f} {m['peak_mem_mib']:9.0f}")
    print(json.dumps({"bench": "train", **figures}))


if __name__ == "__main__":
    main()
