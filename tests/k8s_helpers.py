"""Helpers for tests/test_k8s.py: read the manifests and run their containers on a local folder."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "configs" / "k8s"
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def documents() -> dict[str, list[dict[str, Any]]]:
    """Every YAML document under configs/k8s, by file name."""
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(K8S.glob("*.yaml"))}


def job(name: str) -> dict[str, Any]:
    """The Job manifest in ``configs/k8s/<name>``."""
    (doc,) = documents()[name]
    assert doc["kind"] == "Job"
    return doc


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of command/args: ``$$`` escapes, unknown names stay."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _REF.sub(sub, text)


def remount(text: str, mounts: dict[str, Path]) -> str:
    """Replace each mount path (as a whole path prefix) by the local folder standing in for it."""
    for mount, local in mounts.items():
        text = re.sub(re.escape(mount.rstrip("/")) + r"(?=/|$|[\s'\";])", str(local), text)
    return text


def argv(container: dict[str, Any], mounts: dict[str, Path], env: dict[str, str]) -> list[str]:
    """The container's command + args as the kubelet would run them, on local folders."""
    values = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    values.update(env)
    words = [*container.get("command", []), *container.get("args", [])]
    return [remount(expand(str(w), values), mounts) for w in words]


def mounts_of(doc: dict[str, Any], volume_dirs: dict[str, Path]) -> dict[str, Path]:
    """mountPath -> local folder for the main container, from the pod's volume names."""
    spec = doc["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return {m["mountPath"]: volume_dirs[m["name"]] for m in container["volumeMounts"]}


def without_shard_flags(words: list[str]) -> list[str]:
    """The same command line as one unsharded process."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("--shard-index", "--num-shards"):
            skip = True
        else:
            out.append(word)
    return out


def replace_value(words: list[str], flag: str, value: str) -> list[str]:
    """``words`` with the value after ``flag`` replaced."""
    i = words.index(flag)
    return [*words[:i + 1], value, *words[i + 2:]]
