"""Class 6, the simulator is as strict as vLLM: 400 for what vLLM refuses, one log line for
malformed HTTP, one max_tokens rule for serve and simulate; ab checks both runs first."""
from __future__ import annotations

import json
import re
import signal
import socket
import urllib.error
import urllib.request

import pytest

from .helpers import kill_tree, listing, one_error_line, run, start

MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct-FP8"
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
       "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = start("serve", "--port", 0, "--profile", "zero-delay",
                 cwd=tmp_path_factory.mktemp("serve"))
    try:
        line = proc.stdout.readline().decode()
        url = re.search(r"listening on (\S+)", line).group(1)
        model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        yield proc, url, model
    finally:
        kill_tree(proc)


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


GOOD = {"role": "user", "content": [{"type": "text", "text": "hi"},
                                    {"type": "image_url", "image_url": {"url": PNG}}]}
REFUSED = {
    "alien role": {"messages": [{"role": "alien", "content": "hi"}]},
    "temperature hot": {"messages": [GOOD], "temperature": "hot"},
    "negative temperature": {"messages": [GOOD], "temperature": -1},
    "top_p zero": {"messages": [GOOD], "top_p": 0},
    "no content": {"messages": [{"role": "user"}]},
    "bare image_url": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": PNG}]}]},
    "stop not text": {"messages": [GOOD], "stop": 5},
    "huge max_tokens": {"messages": [GOOD], "max_tokens": 100_000_000},
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_simulator_refuses_what_vllm_refuses(server, case):
    _, url, model = server
    status, body = _post(url, {"model": model, **REFUSED[case]})
    assert status == 400 and body["error"]["message"]


def test_simulator_accepts_the_usual_request(server):
    _, url, model = server
    status, body = _post(url, {"model": model, "max_tokens": 5, "temperature": 0.7,
                               "messages": [{"role": "system", "content": "be brief"}, GOOD,
                                            {"role": "assistant", "content": None},
                                            {"role": "user", "content": "more"}]})
    assert status == 200 and body["usage"]["completion_tokens"] == 5


def test_malformed_http_logs_one_line_per_request(tmp_path):
    proc = start("serve", "--port", 0, "--profile", "zero-delay", cwd=tmp_path)
    try:
        port = int(re.search(r":(\d+) ", proc.stdout.readline().decode()).group(1))
        bad = (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
               b"GET / HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n")
        for data in bad:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(data)
                assert sock.recv(64).startswith(b"HTTP/1.")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        kill_tree(proc)
    err = err.decode()
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if "malformed request" in x]
    assert len(lines) == len(bad)


def test_simulate_has_the_servers_max_tokens_rule(tmp_path, small_dataset):
    res = run("simulate", small_dataset, "--profile", "zero-delay", "-q", "--extra-inputs",
              "max_tokens:100000000", cwd=tmp_path)
    assert res.returncode == 2 and "maximum context length" in one_error_line(res.stderr)
    res = run("simulate", small_dataset, "--profile", "zero-delay", "-q", "--extra-inputs",
              "max_tokens:2", "--extra-inputs", "min_tokens:3", cwd=tmp_path)
    assert res.returncode == 2 and "min_tokens" in one_error_line(res.stderr)


@pytest.mark.parametrize("bad", [["--b-profile", "no-such-profile"],
                                 ["--b-sim-arg=--no-such-flag"],
                                 ["--b-sim-arg=--max-running", "--b-sim-arg=x"],
                                 ["--b-cache-gb", "-1"]])
def test_ab_checks_run_b_before_running_a(tmp_path, small_dataset, bad):
    res = run("ab", "--input-file", small_dataset, "--request-count", 5, "-q",
              "--output-dir", "ab", *bad, cwd=tmp_path)
    line = one_error_line(res.stderr)
    assert res.returncode == 2 and ("run B" in line or "--b-" in line)
    assert listing(tmp_path) == []  # run A never started


@pytest.fixture(scope="module")
def clip_urls(tmp_path_factory):
    """A valid video data URL and WAV data, from the generator."""
    folder = tmp_path_factory.mktemp("clips")
    res = run("pool", "-n", 1, "--pool-size", 1, "--images-per-request", 0,
              "--videos-per-request", 1, "--audios-per-request", 1, "--video-frames", 4,
              "--video-size", "64x48", "--audio-duration", 0.5, "--delivery", "data-url",
              "--tokenizer", "words", "-q", "-o", "c.jsonl", cwd=folder)
    assert res.returncode == 0, res.stderr
    row = json.loads((folder / "c.jsonl").read_text().splitlines()[0])
    return row["videos"][0], row["audios"][0].split(",", 1)[1]


def _media(part: dict) -> dict:
    return {"max_tokens": 2, "messages": [{"role": "user", "content": [part]}]}


def test_video_url_must_be_an_object_as_image_url_is(server, clip_urls):
    _, url, model = server
    video, _ = clip_urls
    ok = {"type": "video_url", "video_url": {"url": video}}
    assert _post(url, {"model": model, **_media(ok)})[0] == 200
    status, body = _post(url, {"model": model, **_media({"type": "video_url", "video_url": video})})
    assert status == 400 and "'video_url' must be an object" in body["error"]["message"]  # was 200


@pytest.mark.parametrize("fmt", ["flac", "FLAC", "ogg"])
def test_an_audio_format_is_checked_even_for_a_clip_seen_before(server, clip_urls, fmt):
    _, url, model = server
    _, wav = clip_urls
    part = {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
    assert _post(url, {"model": model, **_media(part)})[0] == 200
    part["input_audio"]["format"] = fmt
    status, body = _post(url, {"model": model, **_media(part)})
    assert status == 400 and "unsupported audio format" in body["error"]["message"]  # was 200
