"""The deployment files read right: every Grafana panel's PromQL names a metric the code exports
(project04's server, project03's trainer and GPU collector), the provisioning, Prometheus and
compose files agree with each other and with the servers' defaults, and the Dockerfile builds
on a CUDA runtime base with the project installed (hadolint where it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))

# PromQL words that are not metric names
_PROMQL = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "topk", "bottomk", "clamp_min", "clamp_max", "abs", "delta", "deriv",
    "label_values", "sum_over_time", "avg_over_time", "max_over_time", "vector", "scalar",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: strings, label matchers, ranges and
    by/without groups taken out, then every identifier that is not a function call or a
    keyword."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word, after = m.group(0), e[m.end() :].lstrip()[:1]
        if after == "(" or word in _PROMQL or re.fullmatch(r"[0-9.e]+", word):
            continue
        names.add(word)
    return names


def _sample_names(text: str) -> set[str]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture(scope="module")
def exported(monkeypatch_module) -> set[str]:
    """Every sample name the code exports: a ServerMetrics with one observation of each kind,
    and project03's TrainingMetrics with an NVML report of one GPU with every field set."""
    from project03_capstone_infra import health
    from project04_llm_inference.server.metrics import ServerMetrics

    server = ServerMetrics("m")
    server.observe_request("stop", 0.1, 0.01, 0.5, prompt_tokens=3, output_tokens=4)
    body, _ = server.render()
    gpu = health.GPUHealth(index=0, name="fake", throttle_reasons=[])
    for f in health.GPUHealth.__dataclass_fields__.values():
        if getattr(gpu, f.name) is None:
            setattr(gpu, f.name, 1)
    report = health.GPUReport(present=True, gpus=[gpu])
    monkeypatch_module.setattr(health, "gpu_snapshot", lambda: report)
    training = health.TrainingMetrics(gpu=True)
    return _sample_names(body.decode()) | _sample_names(training.scrape_text())


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _panels(path: Path) -> list[dict]:
    board = json.loads(path.read_text())
    out = []
    for p in board["panels"]:
        out += [p, *p.get("panels", [])]  # rows hold panels
    return [p for p in out if p.get("type") != "row"]


def _unknown(path: Path, exported: set[str]) -> list[str]:
    bad = []
    for panel in _panels(path):
        targets = panel.get("targets") or []
        if not targets:
            bad.append(f"{panel['title']}: no query")
        for t in targets:
            names = metric_names(t["expr"])
            if not names:
                bad.append(f"{panel['title']}: {t['expr']!r} names no metric")
            bad += [f"{panel['title']}: {n}" for n in sorted(names - exported)]
    return bad


def test_the_promql_reader_finds_the_metrics():
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{model_name=~"$m"}[$__rate_interval])))'
        " / sum(rate(b_total[5m])) + c"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_there_are_dashboards_for_the_server_and_the_trainer():
    names = {p.stem for p in DASHBOARDS}
    assert {"project04-serving", "project03-training"} <= names, names


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_panel_queries_exported_metrics(path, exported):
    assert _unknown(path, exported) == []


def test_a_misspelled_metric_is_caught(tmp_path, exported):
    board = json.loads((DEPLOY / "grafana" / "dashboards" / "project04-serving.json").read_text())
    board["panels"][0]["targets"][0]["expr"] = "rate(llm_time_to_first_tokn_seconds_bucket[1m])"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(board))
    assert _unknown(bad, exported) == [
        f"{board['panels'][0]['title']}: llm_time_to_first_tokn_seconds_bucket"
    ]


def test_the_serving_dashboard_covers_the_servers_metrics():
    board = (DEPLOY / "grafana" / "dashboards" / "project04-serving.json").read_text()
    for name in (
        "llm_time_to_first_token_seconds",
        "llm_time_per_output_token_seconds",
        "llm_num_requests_running",
        "llm_num_requests_waiting",
        "llm_kv_cache_usage_ratio",
        "llm_num_preemptions",
        "llm_prefix_cache_hits",
        "llm_spec_decode_num_accepted_tokens",
    ):
        assert name in board, name


def test_provisioning_prometheus_and_compose_agree():
    from project04_llm_inference.__main__ import ServeConfig

    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uids = {d["uid"] for d in ds["datasources"]}
    for path in DASHBOARDS:
        for panel in _panels(path):
            assert panel["datasource"]["uid"] in uids, (path.name, panel["title"])
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"prometheus", "grafana"} <= set(services)
    for svc in services.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (DEPLOY / src).exists() or "${" in vol, vol
    mounts = dict(v.split(":")[:2][::-1] for v in services["grafana"]["volumes"])
    provider = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/dashboards.yml").read_text()
    )
    assert mounts[provider["providers"][0]["options"]["path"]] == "./grafana/dashboards"
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    target = jobs["project04-serving"]["static_configs"][0]["targets"][0]
    assert target.endswith(f":{ServeConfig.__dataclass_fields__['port'].default}")


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", re.sub(r"(?m)^\s*#.*\n", "", text))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_installs_the_project_on_a_cuda_runtime():
    steps = _dockerfile()
    args = {a.split("=")[0]: a.partition("=")[2] for k, a in steps if k == "ARG"}
    base = next(a for k, a in steps if k == "FROM")
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.fullmatch(r"nvidia/cuda:[\d.]+-runtime-ubuntu[\d.]+", base), base
    runs = " ".join(a for k, a in steps if k == "RUN")
    assert 'pip install -e ".[' in runs and "cuda-nvcc" in runs
    for k, a in steps:
        if k == "COPY" and a != ". .":
            src = a.split()[0]
            assert (ROOT / src).exists(), src
    assert next(a for k, a in reversed(steps) if k == "USER") != "root"
    assert any(k == "CMD" for k, _ in steps)


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed")
def test_hadolint_passes():
    r = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
