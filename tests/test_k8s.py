"""Container image and Kubernetes manifests: static checks, offline schema validation, and the
Jobs' exact command lines run against a temporary folder standing in for the volume."""
from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
from pathlib import Path

import pytest
from k8s_helpers import ROOT, argv, documents, job, mounts_of, replace_value, without_shard_flags
from loadgen_helpers import late_for_the_start, serve, with_common_start

# Sizes added after a manifest's own flags (the last value wins) where its real sizes are slow.
SMALL_LARGE = ["--num-requests", "60", "--pool-size", "12"]
SMALL_SW = ["--users", "4", "--turns", "3", "--image-size", "240x108", "--text-tokens", "64"]


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "configs" / "docker" / "Dockerfile").read_text()
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_slim_nonroot_entrypoint():
    ins = dockerfile()
    froms = [a for i, a in ins if i == "FROM"]
    assert len(froms) == 1 and froms[0].startswith("python:") and froms[0].endswith("-slim")
    users = [a for i, a in ins if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert json.loads(next(a for i, a in ins if i == "ENTRYPOINT")) == ["mmdatagen"]
    assert any(i == "RUN" and "pip install" in a and " ." in a for i, a in ins)
    for source in (a.split()[:-1] for i, a in ins if i == "COPY"):
        assert all((ROOT / s).exists() for s in source), source
    assert [i for i, _ in ins].index("USER") > max(n for n, (i, _) in enumerate(ins) if i == "RUN")


def test_manifests_parse_and_validate_offline(monkeypatch):
    import kubernetes_validate

    def no_network(*_a, **_k):
        raise AssertionError("validation tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    docs = documents()
    (kust,) = docs.pop("kustomization.yaml")
    assert kust["kind"] == "Kustomization"
    assert sorted(kust["resources"]) == sorted(docs), "kustomization must list every manifest"
    kinds = []
    for items in docs.values():
        for doc in items:
            kubernetes_validate.validate(doc, "1.33", strict=True)
            kinds.append(doc["kind"])
    assert kinds.count("Job") == 7 and "PersistentVolumeClaim" in kinds and "ConfigMap" in kinds
    bad = job("job-seed-a.yaml")
    bad["spec"]["template"]["spec"]["containers"][0]["argz"] = ["pool"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.33", strict=True)


def test_configmap_embeds_the_presets_exactly():
    (cm,) = documents()["presets-configmap.yaml"]
    assert cm["data"] and set(cm["data"]) == {"qwen3-vl-30b-pool200.yaml", "qwen3.6-sliding-window.yaml"}
    for name, text in cm["data"].items():
        assert text == (ROOT / "configs" / name).read_text(), name


def test_jobs_run_as_nonroot_on_the_volume():
    for name, (doc,) in ((n, d) for n, d in documents().items() if d[0]["kind"] == "Job"):
        spec = doc["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
        claims = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert claims == ["mmdatagen-data"], name


@pytest.fixture
def volume(tmp_path) -> dict[str, Path]:
    """Local folders for the pod volumes: the PVC and the presets ConfigMap (its files)."""
    data, presets = tmp_path / "data", tmp_path / "presets"
    data.mkdir()
    presets.mkdir()
    (cm,) = documents()["presets-configmap.yaml"]
    for name, text in cm["data"].items():
        (presets / name).write_text(text)
    return {"data": data, "presets": presets}


def run_pod(run_cli, doc, volume, env=None, extra=()) -> list[str]:
    """Run the init containers (shell) then the main container's command line; returns its argv."""
    env = dict(env or {})
    mounts = mounts_of(doc, volume)
    spec = doc["spec"]["template"]["spec"]
    for init in spec.get("initContainers", []):
        words = argv(init, mounts, env)
        subprocess.run(words, check=True, timeout=20, env={**os.environ, **env},
                       stdout=subprocess.DEVNULL)
    (container,) = spec["containers"]
    assert "command" not in container, "main containers use the image's mmdatagen entrypoint"
    words = [*argv(container, mounts, env), *extra]
    result = run_cli(*words)
    assert result.exit_code == 0, f"{shlex.join(words)}\n{result.output}"
    return words


@pytest.mark.slow
def test_indexed_job_shards_merge_to_single_process_bytes(run_cli, volume, tmp_path):
    doc = job("job-sharded.yaml")
    count = doc["spec"]["completions"]
    assert doc["spec"]["completionMode"] == "Indexed" and doc["spec"]["parallelism"] == count
    words = []
    for k in range(count):
        words = run_pod(run_cli, doc, volume, {"JOB_COMPLETION_INDEX": str(k)}, SMALL_LARGE)
        assert words[words.index("--shard-index") + 1] == str(k)
        assert words[words.index("--num-shards") + 1] == str(count)
    out = Path(words[words.index("--output") + 1])
    assert len(list(out.parent.glob("*.shard-*.jsonl"))) == count
    run_pod(run_cli, job("job-merge.yaml"), volume)
    single = tmp_path / "single" / out.name
    one = replace_value(without_shard_flags(words), "--output", str(single))
    assert run_cli(*one).exit_code == 0
    assert out.read_bytes() == single.read_bytes() and out.stat().st_size > 0
    manifest = out.with_name(out.name + ".manifest.json")
    assert manifest.read_bytes() == single.with_name(single.name + ".manifest.json").read_bytes()
    first = json.loads(out.read_text().splitlines()[0])
    assert first["images"][0].startswith(str(volume["data"])) and Path(first["images"][0]).is_file()


@pytest.mark.slow
def test_sliding_window_job(run_cli, volume):
    words = run_pod(run_cli, job("job-sliding-window.yaml"), volume, extra=SMALL_SW)
    out = Path(words[words.index("--output") + 1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and rows[0]["session_id"].startswith("user_")
    assert rows[0]["images"][0].startswith("data:image/jpeg;base64,")


@pytest.fixture
def simulator():
    """The embedded simulator (zero-delay profile) standing in for the service."""
    from mmdatagen.settings.sim import Simulator
    from mmdatagen.sim.embedded import EmbeddedServer

    with EmbeddedServer(Simulator().with_values({"profile": "zero-delay", "cache_size": 0})
                        ) as server:
        yield server.url


@pytest.mark.slow
def test_seed_a_job_then_bench_job(run_cli, volume, simulator):
    words = run_pod(run_cli, job("job-seed-a.yaml"), volume)
    out = Path(words[words.index("--output") + 1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1000 and len({r["images"][0] for r in rows}) == 200
    assert all(r["images"][0].startswith(str(volume["data"]) + "/") for r in rows)
    assert Path(rows[0]["images"][0]).is_file()
    bench = job("job-bench.yaml")
    words = run_pod(run_cli, bench, volume, {"VLM_URL": simulator}, ["--quiet"])
    assert words[words.index("--url") + 1] == simulator
    export_dir = Path(words[words.index("--output-dir") + 1])
    assert export_dir.is_relative_to(volume["data"])
    export = json.loads((export_dir / "profile_export_mmdatagen.json").read_text())
    assert export["request_count"]["avg"] == 1000 and export["error_request_count"]["avg"] == 0


@pytest.mark.slow
def test_sharded_bench_job_then_merge_runs(volume, tmp_path):
    """The Indexed Job's workers, each its own process on loopback, start together against one
    'mmdatagen serve'; the merge Job joins them into the benchmark one process sends."""
    import shutil
    import sys

    doc = job("job-bench-sharded.yaml")
    count = doc["spec"]["completions"]
    assert doc["spec"]["completionMode"] == "Indexed" and doc["spec"]["parallelism"] == count
    seed = volume["data"] / "seed-a"
    py = [sys.executable, "-m", "mmdatagen"]
    subprocess.run([*py, "pool", "-n", "48", "--pool-size", "12", "--image-size", "64x48",
                    "--text-tokens", "16", "-o", str(seed / "seed_a.jsonl"), "-q"], check=True,
                   timeout=300, stdout=subprocess.DEVNULL)
    mounts = mounts_of(doc, volume)

    def workers(margin: float) -> list[str]:
        shutil.rmtree(volume["data"] / "bench", ignore_errors=True)  # a late attempt's exports
        with serve(tmp_path) as url:
            start = str(int(time.time() + margin))  # as the ConfigMap holds it: whole seconds
            procs = []
            for k in range(count):
                env = {"JOB_COMPLETION_INDEX": str(k), "START_AT": start, "VLM_URL": url}
                words = argv(doc["spec"]["template"]["spec"]["containers"][0], mounts, env)
                assert words[words.index("--shard-index") + 1] == str(k)
                assert words[words.index("--num-shards") + 1] == str(count)
                assert words[words.index("--start-at") + 1] == start
                procs.append(subprocess.Popen([*py, *words, "--quiet"], stderr=subprocess.PIPE,
                                              stdout=subprocess.DEVNULL, text=True))
            return late_for_the_start(procs)

    with_common_start(workers)
    merge = job("job-merge-runs.yaml")
    spec = merge["spec"]["template"]["spec"]
    mounts = mounts_of(merge, volume)
    for init in spec["initContainers"]:
        subprocess.run(argv(init, mounts, {}), check=True, timeout=20, stdout=subprocess.DEVNULL)
    words = argv(spec["containers"][0], mounts, {})
    subprocess.run([*py, *words, "--quiet"], check=True, timeout=300, stdout=subprocess.DEVNULL)
    out = Path(words[words.index("--output-dir") + 1])
    export = json.loads((out / "profile_export_mmdatagen.json").read_text())
    assert export["request_count"]["avg"] == 48 and export["error_request_count"]["avg"] == 0
    assert [s["index"] for s in export["run_info"]["shards"]] == list(range(count))
    cache = export["image_cache"]
    assert cache["predicted"]["hits"] == cache["measured"]["hits"]
