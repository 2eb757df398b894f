"""Records as columns (``metrics.RecordTable``): the export's maths and ``records.jsonl`` from
whole columns give exactly what the per-record definitions give, byte for byte."""
from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmdatagen.errors import DatasetError
from mmdatagen.export import read_records, record_line, record_lines
from mmdatagen.metrics import RecordTable, RequestRecord, metric_columns

ints = st.one_of(st.none(), st.integers(0, 2**62))
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def records(draw) -> RequestRecord:
    start = draw(st.one_of(st.integers(0, 10**12), st.integers(10**18, 2 * 10**18)))
    first = draw(st.one_of(st.none(), st.integers(start, start + 10**10)))
    end = draw(st.one_of(st.none(), st.integers(first or start, (first or start) + 10**10)))
    error = draw(st.one_of(st.none(), st.fixed_dictionaries(
        {"type": text, "code": st.one_of(st.none(), st.integers(100, 599)), "message": text})))
    return RequestRecord(
        conversation_id=draw(text), turn_index=draw(st.integers(0, 50)),
        phase=draw(st.sampled_from(["warmup", "profiling"])), start_ns=start,
        first_token_ns=first, end_ns=end, output_tokens=draw(st.integers(0, 3000)),
        input_tokens=draw(st.one_of(st.none(), st.integers(0, 10**6))),
        num_images=draw(st.integers(0, 9)), error=error, image_hits=draw(ints),
        image_misses=draw(ints), server_ttft_ns=draw(st.one_of(st.none(), st.integers(0, 10**9))),
        x_request_id=draw(text), streaming=draw(st.booleans()),
        response_end_ns=draw(st.one_of(st.none(), st.integers(start, start + 10**11))),
        predicted_hits=draw(ints), http_status=draw(st.one_of(st.none(), st.integers(100, 599))),
        dispatch_index=draw(ints))


@settings(max_examples=60, deadline=None)
@given(st.lists(records(), max_size=30))
def test_lines_from_columns_are_the_per_record_lines(recs):
    expected = b"".join(orjson.dumps(record_line(r)) + b"\n"
                        for r in sorted(recs, key=lambda r: r.start_ns))
    assert b"".join(record_lines(recs)) == expected
    assert b"".join(record_lines(RecordTable.from_records(recs))) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(records(), max_size=30))
def test_a_table_holds_every_field(recs):
    assert RecordTable.from_records(recs).records() == recs


def test_metric_columns_follow_the_definitions():
    ms = 1_000_000
    r = RequestRecord(conversation_id="c", turn_index=0, phase="profiling", start_ns=1000 * ms,
                      first_token_ns=1050 * ms, end_ns=1150 * ms, output_tokens=11,
                      input_tokens=None, num_images=2, error=None, image_hits=None,
                      image_misses=None, server_ttft_ns=49 * ms, x_request_id="r")
    failed = RequestRecord(conversation_id="c", turn_index=1, phase="profiling", start_ns=0,
                           first_token_ns=None, end_ns=None, output_tokens=0, input_tokens=5,
                           num_images=1, error={"type": "x", "code": 500, "message": "m"},
                           image_hits=None, image_misses=None, server_ttft_ns=None,
                           x_request_id="f")
    cols = metric_columns(RecordTable.from_records([r, failed]))
    assert cols["time_to_first_token"][0] == pytest.approx(50)
    assert cols["inter_token_latency"][0] == pytest.approx(10)
    assert cols["client_added_ttft"][0] == pytest.approx(1)
    assert cols["input_sequence_length"].tolist()[0] != cols["input_sequence_length"][0]  # NaN
    assert cols["num_images"].tolist() == [2.0, 1.0]  # a failed request still counts images
    assert all(cols[tag][1] != cols[tag][1] for tag in cols if tag != "num_images")
    assert r.values() == {tag: v[0] for tag, v in cols.items() if v[0] == v[0]}


def test_read_records_takes_every_form_and_names_a_bad_line(tmp_path):
    base = dict(conversation_id='a,"b"', turn_index=0, phase="profiling", first_token_ns=None,
                end_ns=None, output_tokens=0, input_tokens=None, num_images=0, image_hits=None,
                image_misses=None, server_ttft_ns=None, x_request_id="x")
    ok = RequestRecord(**base, start_ns=5, error=None)
    bad = RequestRecord(**base, start_ns=3, error={"type": "t", "code": None, "message": "},"})
    path = tmp_path / "records.jsonl"
    pretty = orjson.dumps(record_line(ok), option=orjson.OPT_INDENT_2).replace(b"\n", b" ")
    path.write_bytes(b"".join(record_lines([ok, bad])) + b"\n" + pretty + b"\n")
    assert read_records(path).records() == [bad, ok, ok]  # compact, with error, pretty
    path.write_bytes(b"".join(record_lines([ok])) + b'{"metadata": {"x": 1}}\n')
    with pytest.raises(DatasetError, match=r"records.jsonl:2: .*request_start_ns"):
        read_records(path)
    path.write_bytes(b"".join(record_lines([ok])) + b"{not json\n")
    with pytest.raises(DatasetError, match=r"records.jsonl:2: not a records.jsonl line"):
        read_records(path)
