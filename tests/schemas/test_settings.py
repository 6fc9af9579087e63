"""``Settings.from_flags``: the one way commands turn flags into settings, and the flag a bad value names."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ubi_pipeline.cli import main
from ubi_pipeline.schemas.errors import SettingsError
from ubi_pipeline.schemas.settings import Settings


def test_given_flags_win_unset_ones_fall_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UBI_MAX_RANK", "7")
    monkeypatch.setenv("UBI_SEED", "3")
    args = argparse.Namespace(db=Path("x.duckdb"), seed=None, max_rank=None, not_a_setting="ignored")
    s = Settings.from_flags(args)
    assert (s.db, s.seed, s.max_rank) == (Path("x.duckdb"), 3, 7)
    # `only` narrows the flags that count; overrides are set like flags
    s = Settings.from_flags(argparse.Namespace(db=Path("a"), seed=9), only=("seed",), max_rank=4)
    assert (s.db, s.seed, s.max_rank) == (Path("ubi.duckdb"), 9, 4)


def test_a_bad_flag_is_named_as_typed() -> None:
    args = argparse.Namespace(consumer_batch_records=0, flag_names={"consumer_batch_records": "--batch-records"})
    with pytest.raises(SettingsError) as err:
        Settings.from_flags(args)
    assert str(err.value) == "--batch-records: Input should be greater than or equal to 1 (got 0)"
    assert err.value.setting == "consumer_batch_records"
    # without the parser's names: the field's name as a flag
    with pytest.raises(SettingsError, match=r"^--max-rank: Input should be less than or equal to 100 \(got 101\)$"):
        Settings.from_flags({"max_rank": 101})


def test_a_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UBI_KAFKA_PARTITIONS", "0")
    with pytest.raises(SettingsError, match=r"^UBI_KAFKA_PARTITIONS: Input should be greater than or equal to 1$"):
        Settings.from_flags(argparse.Namespace())


def test_ubi_consume_with_a_bad_batch_size_exits_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, pydantic's ValidationError escaped and `ubi consume --batch-records 0` exited 3 (a bug)."""
    code = main(["consume", "--bootstrap", "127.0.0.1:9", "--db", str(tmp_path / "s.duckdb"), "--batch-records", "0"])
    assert code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: --batch-records: Input should be greater than or equal to 1 (got 0)" in err
    assert not (tmp_path / "s.duckdb").exists()  # refused before anything was opened


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["serve", "--db", "{db}", "--sink", "kafka", "--ack-timeout", "0"], "--ack-timeout"),
        (["report", "--db", "{db}", "--window", "0"], "--window"),
        (["simulate", "--sessions", "1", "--seed", "x"], None),  # argparse's own type check: exit 2
    ],
)
def test_every_command_maps_bad_settings_to_exit_2(
    argv: list[str], flag: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.replace("{db}", str(tmp_path / "none.duckdb")) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses a value its type cannot parse
        code = int(exc.code or 0)
    assert code == 2
    if flag is not None:
        assert f"error: {flag}: " in " ".join(capsys.readouterr().err.split())
