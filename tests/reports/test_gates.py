"""Quality gates: thresholds from TOML and flags, every shortfall named, CI exit codes."""

from __future__ import annotations

import pytest
from joint_fixtures import build_store, ubi, write_human

from ubi_pipeline.reports.gates import GateError, Threshold, check, load_thresholds, parse_flag, qualify
from ubi_pipeline.schemas.errors import InputFileError

VALUES = {
    "shop/ranker=a": {"human/ndcg@10": (0.8155, 2), "online/abandonment": (0.4, 5), "human/mrr": (float("nan"), 0)},
    "shop/ranker=b": {"human/ndcg@10": (0.8295, 2), "online/abandonment": (1 / 3, 3)},
}


def test_names_and_flags():
    assert qualify("NDCG@10") == "human/ndcg@10"
    assert qualify("implicit:ctr/MRR") == "implicit:ctr/mrr"
    assert parse_flag("online/ctr@10=0.05") == Threshold("online/ctr@10", "min", 0.05)
    assert parse_flag("online/abandonment=0.6", "max").op == "max"
    for bad in ("ndcg@10", "ndcg@10=high", "=0.5", "ndcg@10=nan"):
        with pytest.raises(GateError):
            parse_flag(bad)


def test_check_names_every_shortfall():
    ts = [Threshold("human/ndcg@10", "min", 0.82), Threshold("online/abandonment", "max", 0.35),
          Threshold("human/mrr", "min", 0.1), Threshold("human/map", "min", 0.1, ("shop/ranker=b",)),
          Threshold("human/ndcg@10", "min", 0.1, ("shop/ranker=z",))]
    results = check(ts, VALUES)
    failed = {(r.system, r.metric) for r in results if not r.passed}
    assert failed == {
        ("shop/ranker=a", "human/ndcg@10"),  # 0.8155 < 0.82
        ("shop/ranker=a", "online/abandonment"),  # 0.4 > 0.35
        ("shop/ranker=a", "human/mrr"),  # NaN: no query to compute it on
        ("shop/ranker=b", "human/mrr"),  # not computed for b
        ("shop/ranker=b", "human/map"),  # not computed
        ("shop/ranker=z", "human/ndcg@10"),  # no such system
    }
    passed = [r for r in results if r.passed]
    assert {(r.system, r.metric) for r in passed} == {("shop/ranker=b", "human/ndcg@10"),
                                                       ("shop/ranker=b", "online/abandonment")}
    text = next(r for r in results if r.metric == "human/mrr").describe()
    assert "no value" in text and ">= 0.1" in text


def test_thresholds_file(tmp_path):
    f = tmp_path / "gates.toml"
    f.write_text('systems = ["shop/ranker=b"]\n[min]\n"ndcg@10" = 0.5\n"online/ctr" = 0.1\n'
                 '[max]\n"online/abandonment" = 0.6\n[system."shop/ranker=a".min]\nmrr = 0.7\n')
    ts = load_thresholds(f)
    assert Threshold("human/ndcg@10", "min", 0.5, ("shop/ranker=b",)) in ts
    assert Threshold("online/abandonment", "max", 0.6, ("shop/ranker=b",)) in ts
    assert Threshold("human/mrr", "min", 0.7, ("shop/ranker=a",)) in ts
    assert len(ts) == 4


@pytest.mark.parametrize(("body", "message", "line"), [
    ('[min]\n"ndcg@10" = \n', "malformed TOML", 2),
    ('[min]\n"ndcg@10" = "high"\n', "must be a number", None),
    ("[minimum]\nx = 1\n", "unknown key", None),
    ("systems = 3\n[min]\nx = 1\n", "systems must be a list", None),
    ("# nothing\n", "no thresholds", None),
    ('[system."a"]\nlow = {x = 1}\n', "may only hold", None),
])
def test_bad_thresholds_files_name_file_and_line(tmp_path, body, message, line):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(InputFileError, match=message) as err:
        load_thresholds(f)
    assert err.value.path == str(f) and err.value.line == line


@pytest.fixture()
def store(tmp_path):
    return build_store(tmp_path / "ubi.duckdb"), write_human(tmp_path / "h.jsonl")


def test_cli_exit_code_when_a_gate_fails(store, tmp_path, capsys):
    db, qrels = store
    gates = tmp_path / "gates.toml"
    # hand values (test_report_command): nDCG@10 a = 0.815465, b = 0.829500; abandonment a = 0.4, b = 1/3
    gates.write_text('[min]\n"ndcg@10" = 0.82\n[max]\n"online/abandonment" = 0.35\n')
    code = ubi(["report", "--db", str(db), "--qrels", str(qrels), "--thresholds", str(gates), "--format", "md",
                 "--out", str(tmp_path / "r.md")])
    assert code == 1
    err = capsys.readouterr().err
    # every shortfall is named: ranker a misses both, ranker b passes both
    assert "shop/ranker=a: human/ndcg@10 = 0.8155" in err
    assert "shop/ranker=a: online/abandonment = 0.4" in err
    assert "ranker=b" not in err
    assert "| shop/ranker=b | human/ndcg@10 | >= 0.82 | 0.8295 | PASS" in (tmp_path / "r.md").read_text()


def test_cli_exit_code_when_every_gate_passes(store, tmp_path, capsys):
    db, qrels = store
    code = ubi(["report", "--db", str(db), "--qrels", str(qrels), "--min", "ndcg@10=0.8", "--min", "recall@10=1",
                 "--max", "online/abandonment=0.5", "--format", "json", "--out", str(tmp_path / "r.json")])
    assert code == 0
    assert "gate failed" not in capsys.readouterr().err


def test_cli_bad_threshold_is_a_usage_error(store, tmp_path, capsys):
    db, qrels = store
    assert ubi(["report", "--db", str(db), "--qrels", str(qrels), "--min", "ndcg@10"]) == 2
    assert "METRIC=VALUE" in capsys.readouterr().err


def test_unknown_metric_names_are_bad_input_listing_the_known(tmp_path):
    """Issue 12: a typo ("ndgc@10") is exit 2 with the known names, never a failed gate (exit 1)."""
    from ubi_pipeline.reports.gates import GateError, load_thresholds, parse_flag

    with pytest.raises(GateError, match=r"unknown metric 'human/ndgc@10'.*known offline metrics: p@k, recall"):
        parse_flag("ndgc@10=0.5")
    with pytest.raises(GateError, match=r"unknown online metric 'online/ctr10'; known: online/ctr, online/ctr@k"):
        parse_flag("online/ctr10=0.1", "min")
    assert parse_flag("online/ctr@5=0.1").metric == "online/ctr@5"
    assert parse_flag("implicit:pbm/ndcg_exp@10=0.1").metric == "implicit:pbm/ndcg_exp@10"
    f = tmp_path / "gates.toml"
    f.write_text('[min]\n"ndgc@10" = 0.6\n')
    with pytest.raises(InputFileError, match=r"gates.toml.*unknown metric 'human/ndgc@10'"):
        load_thresholds(f)


def test_report_with_a_misspelt_gate_exits_2(tmp_path, capsys):
    db = build_store(tmp_path / "ubi.duckdb")
    human = write_human(tmp_path / "h.jsonl")
    assert ubi(["report", "--db", str(db), "--qrels", str(human), "--min", "ndgc@10=0.5"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown metric 'human/ndgc@10'" in err and "ndcg[@k]" in err


def test_interleaving_gate_names_are_known_and_typos_exit_as_bad_input() -> None:
    """Interleaving gates (reports/interleaving.gate_values) pass the name check; a misspelt statistic does not."""
    from ubi_pipeline.reports.gates import GateError, check_name
    from ubi_pipeline.reports.interleaving import GATE_STATISTICS

    for name in GATE_STATISTICS:
        assert check_name(f"interleaving/candidate-vs-baseline/{name}") == f"interleaving/candidate-vs-baseline/{name}"
    with pytest.raises(GateError, match="win_rate"):
        check_name("interleaving/candidate-vs-baseline/winrate")
