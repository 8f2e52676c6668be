"""The synthetic writer builds every row's envelope through the one envelope builder (mkb.events._envelope)."""

import polars as pl

from mkb.analysis.synthetic import SynthSpec, write_synthetic
from mkb.events import read, schemas
from mkb.events._envelope import FIELDS, Envelope


def test_every_synthetic_row_gets_its_envelope_from_the_builder(tmp_path, monkeypatch):
    built = []
    row = Envelope.row

    def spy(self, kind, version, attempt_id, payload, ts):
        out = row(self, kind, version, attempt_id, payload, ts)
        built.append(out["event_id"])
        return out

    monkeypatch.setattr(Envelope, "row", spy)
    spec = SynthSpec(seed=5, models=("m",), model_means=(0.6,), n_problems=4, replicates=3, n_annotated=2)
    res = write_synthetic(spec, str(tmp_path / "ds"))
    ids = []
    for kind in schemas():
        df = read(kind, res.store)
        if df.height:
            assert df.select(pl.col(c).null_count() for c in FIELDS if c != "attempt_id").row(0) == (0,) * (len(FIELDS) - 1), kind
            ids += df["event_id"].to_list()
    assert len(ids) == res.events == len(built) and sorted(ids) == sorted(built)  # every stored row, and only those, built there


def test_synthetic_seq_numbers_each_attempts_events_in_order(tmp_path):
    res = write_synthetic(SynthSpec(seed=6, models=("m",), model_means=(0.6,), n_problems=3, replicates=3), str(tmp_path / "ds"))
    rows = pl.concat([read(k, res.store).select("attempt_id", "seq", "ts", "writer", "run_id")
                      for k in ("attempt_started", "skill", "attempt_finished", "verdict")])
    per = rows.sort("ts").group_by("attempt_id", maintain_order=True).agg("seq")
    for seqs in per["seq"].to_list():
        assert seqs == list(range(len(seqs)))  # 0, 1, 2, ... in the order the attempt's events were made
    assert rows["run_id"].unique().to_list() == ["synth-6"] and rows["writer"].n_unique() == 1
    assert rows["writer"][0].count(":") == 2  # host:pid:id, the builder's writer id
