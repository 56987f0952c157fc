"""Scale out on one machine with real processes: a two-node Ray cluster (`ray start --head` plus a
second raylet) running `ray job submit -- vfm-curate ...` (with and without `ray.address=auto`), and torchrun across two
launchers ("nodes") with c10d rendezvous. Each must equal its single-node run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
from vfm_testmedia import write_test_shards

import conf
from curator.pipeline import curate
from curator.writer import read_jsonl

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- curation on a Ray cluster ---------------------------------------------------------------------


class RayCluster:
    """A head node and one worker node on this machine, each with 1 CPU and a custom resource. Its
    processes are found by its own temp dir, so stopping it never touches another Ray instance."""

    def __init__(self):
        # The temp dir is <root>/ray, where Ray looks for the last `ray start` of a machine whose
        # RAY_TMPDIR is <root>. Short: Ray's socket paths are bounded.
        self.root = tempfile.mkdtemp(prefix="vfmray-", dir="/tmp")
        self.temp_dir = os.path.join(self.root, "ray")
        self.port, self.dashboard_port = free_port(), free_port()
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        # Token auth off, as a first `ray start` has it. Unset, the head takes it on where a token file
        # (~/.ray/auth_token) is left from an earlier local Ray, and the second node does not: it was
        # refused, unless this process's own Ray had already set RAY_AUTH_MODE for its children.
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        self.env.pop("RAY_ADDRESS", None)

    def _ray(self, *args: str) -> None:
        r = subprocess.run([str(BIN / "ray"), "start", *args, "--disable-usage-stats"], env=self.env,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr

    def start(self) -> RayCluster:
        self._ray("--head", f"--port={self.port}", "--num-cpus=1", '--resources={"vfm_head": 1}',
                  f"--temp-dir={self.temp_dir}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                  f"--dashboard-port={self.dashboard_port}", *self.agent_ports())
        self._ray(f"--address=127.0.0.1:{self.port}", "--num-cpus=1", '--resources={"vfm_worker": 1}',
                  *self.agent_ports())
        self._wait_for_job_agent()
        return self

    def _wait_for_job_agent(self, timeout: float = 120) -> None:
        """The head's job agent comes up some seconds after `ray start` returns: submit a no-op job
        until one is accepted."""
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run([str(BIN / "ray"), "job", "submit", f"--address={self.dashboard}", "--", "true"],
                               env=self.env, capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                return
            assert time.monotonic() < deadline, r.stdout + r.stderr
            time.sleep(1)

    def pids(self, name: str | None = None) -> list[int]:
        """This cluster's processes, optionally only one kind: those naming its temp dir, and their
        descendants (Ray's agents rename themselves, e.g. `ray::DashboardAgent`)."""
        found, children = [], {}
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # the process ended while we looked
            children.setdefault(ppid, []).append(int(proc.name))
            if self.temp_dir in " ".join(args) and (name is None or name in Path(args[0]).name):
                found.append(int(proc.name))
        if name is None:
            todo = list(found)
            while todo:
                for child in children.get(todo.pop(), []):
                    found.append(child)
                    todo.append(child)
        return sorted(set(found))

    def agent_ports(self) -> list[str]:
        """Ports of a node's agents: two raylets on one machine cannot share the defaults."""
        return [f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]

    def worker_raylet(self) -> int:
        raylets = [p for p in self.pids("raylet")
                   if "vfm_worker" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
        assert len(raylets) == 1, raylets
        return raylets[0]

    def stop(self) -> None:
        for _ in range(3):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    """One cluster for the module's tests (a start costs 15 s): the second of them kills its worker node."""
    c = RayCluster()
    try:
        yield c.start()
    finally:  # also when the test fails
        c.stop()


@pytest.fixture(scope="module")
def inputs(synth_corpus, bikes, tmp_path_factory) -> Path:
    """The synthetic corpus and three copies of bikes.mp4: enough work to spread over two nodes."""
    media_dir, _ = synth_corpus
    root = tmp_path_factory.mktemp("cluster-inputs")
    for p in media_dir.glob("*.mp4"):
        shutil.copy(p, root / p.name)
    for i in range(3):
        shutil.copy(bikes, root / f"bikes-{i}.mp4")
    return root


@pytest.fixture(scope="module")
def single_node(inputs, ray_local, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single-node")
    curate(conf.compose("curate", [f"input={inputs}", f"output={out}", "ray.num_cpus=2"]), log=lambda *_: None)
    return out


def contents(out: Path) -> tuple[list[dict], dict[str, bytes]]:
    """What a curated output holds, without the per-run timings: manifest records by source, and
    every shard member's bytes."""
    records = sorted(({k: v for k, v in r.items() if k != "timings"} for r in read_jsonl(out / "manifest.jsonl")),
                     key=lambda r: r["source"])
    members = {}
    for shard in sorted((out / "shards").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar:
                members[m.name] = tar.extractfile(m).read()
    return records, members


def assert_same_output(a: Path, b: Path) -> None:
    """Same records (but for timings) and byte-identical shard members: videos, captions, metadata."""
    (records_a, members_a), (records_b, members_b) = contents(a), contents(b)
    assert records_a == records_b
    assert sorted(members_a) == sorted(members_b)
    assert sorted(k for k in members_a if members_a[k] != members_b[k]) == []


def submit(cluster: RayCluster, inputs: Path, out: Path, *overrides: str) -> subprocess.Popen:
    entrypoint = [str(BIN / "vfm-curate"), f"input={inputs}", f"output={out}", *overrides]
    return subprocess.Popen([str(BIN / "ray"), "job", "submit", f"--address={cluster.dashboard}", "--", *entrypoint],
                            env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def tasks_per_node(cluster: RayCluster) -> dict[str, int]:
    from ray.util.state import list_nodes, list_tasks

    names = {n.node_id: next(k for k in n.resources_total if k.startswith("vfm_"))
             for n in list_nodes(address=cluster.dashboard) if any(k.startswith("vfm_") for k in n.resources_total)}
    counts: dict[str, int] = {}
    for t in list_tasks(address=cluster.dashboard, limit=10_000, raise_on_missing_output=False):
        if "SourceWorker" in (t.name or "") and t.node_id in names:
            counts[names[t.node_id]] = counts.get(names[t.node_id], 0) + 1
    return counts


def test_ray_job_submit_on_a_two_node_cluster_places_work_on_both_and_equals_one_node(cluster, inputs, single_node,
                                                                                      tmp_path):
    """Submitted as a user first would, without `ray.address`: the job's command has the cluster's
    address in RAY_ADDRESS, and joins it (it had failed: `_system_config must not be provided`)."""
    out = tmp_path / "cluster-out"
    job = submit(cluster, inputs, out)
    log, _ = job.communicate(timeout=600)
    assert "joining the Ray cluster at" in log and "(RAY_ADDRESS)" in log, log[-3000:]
    assert job.returncode == 0 and "succeeded" in log, log[-3000:]
    counts = tasks_per_node(cluster)
    print("SourceWorker tasks per node:", counts)
    assert counts.get("vfm_head", 0) >= 1 and counts.get("vfm_worker", 0) >= 1, counts
    assert_same_output(out, single_node)


def test_killing_the_worker_raylet_mid_job_still_finishes_with_identical_output(cluster, inputs, single_node,
                                                                               tmp_path):
    out = tmp_path / "cluster-out"
    job = submit(cluster, inputs, out, "ray.address=auto")
    deadline = time.monotonic() + 300
    while len(read_jsonl(out / "manifest.jsonl")) < 2:  # the job is under way on both nodes
        assert job.poll() is None and time.monotonic() < deadline, job.stdout.read()[-3000:]
        time.sleep(0.1)
    os.kill(cluster.worker_raylet(), signal.SIGKILL)
    log, _ = job.communicate(timeout=600)
    assert job.returncode == 0 and "succeeded" in log, log[-3000:]
    assert_same_output(out, single_node)


def test_a_run_without_an_address_on_a_machine_with_a_ray_start_cluster_starts_a_local_ray_of_its_own(
        cluster, synth_corpus, tmp_path):
    """A `ray start` records its cluster where `ray.init()` without an address looks first (here:
    RAY_TMPDIR names the cluster's root). A run without `ray.address` joined that cluster, and Ray
    refused the settings of the local instance the run meant to start: `vfm-curate: When connecting
    to an existing cluster, num_cpus and num_gpus must not be provided`. It starts a local Ray of its
    own, and leaves the cluster be."""
    assert (Path(cluster.temp_dir) / "ray_current_cluster").is_file()
    media_dir, _ = synth_corpus
    (tmp_path / "in").mkdir()
    shutil.copy(media_dir / "fade.mp4", tmp_path / "in" / "fade.mp4")
    before = tasks_per_node(cluster)
    run = subprocess.run([str(BIN / "vfm-curate"), f"input={tmp_path / 'in'}", f"output={tmp_path / 'out'}",
                          "ray.num_cpus=1"], env={**cluster.env, "RAY_TMPDIR": cluster.root}, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "existing Ray cluster" not in run.stderr, run.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["kept"] > 0
    assert tasks_per_node(cluster) == before


# --- training across torchrun "nodes" --------------------------------------------------------------

LAYOUT = ["parallel.dp_shard=2", "parallel.cp=2", "parallel.cp_kind=ulysses"]
DATA = ["data.buckets=[[8,32,48],[8,48,32]]", "data.tokens_per_batch=4096", "data.num_workers=1",
        "checkpoint.every_steps=100"]


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_torchrun_across_two_launchers_gives_the_losses_of_one_launcher(tmp_path):
    write_test_shards(tmp_path / "shards", seed=5, num_shards=4, per_shard=6)
    args = lambda run: ["-m", "train", f"run_dir={run}", f"data.shards='{tmp_path / 'shards'}/*.tar'",  # noqa: E731
                        "num_steps=4", *LAYOUT, *DATA]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    one = subprocess.run([*torchrun, "--standalone", "--nproc-per-node=4", *args(tmp_path / "one")], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]

    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [subprocess.Popen([*torchrun, "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                               f"--rdzv-endpoint={endpoint}", "--rdzv-id=vfm-test", *args(tmp_path / "two")],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    logs = [n.communicate(timeout=600)[0] for n in nodes]
    assert all(n.returncode == 0 for n in nodes), "\n".join(log[-2000:] for log in logs)
    assert any("dp=2 cp=2" in log for log in logs)  # the layout the trainer reports
    assert len(losses(tmp_path / "one")) == 4
    assert losses(tmp_path / "two") == losses(tmp_path / "one")

