from pathlib import Path

import pytest

from codec.generated_file import write_or_check


class Unavailable(Exception):
    pass


def _run(path: Path, mode: str, text: str = "generated\n", fail: bool = False) -> int:
    def generate(inputs: list[Path]) -> str:
        assert inputs == []
        if fail:
            raise Unavailable("the jars are not cached")
        return text

    return write_or_check(
        [mode], path=path, generate=generate, command="gen", description=None, errors=(Unavailable,)
    )


def test_write_then_check_is_up_to_date(tmp_path: Path) -> None:
    target = tmp_path / "table.json"
    assert _run(target, "--check") == 1  # missing counts as stale
    assert _run(target, "--write") == 0
    assert target.read_text() == "generated\n"
    assert _run(target, "--check") == 0


def test_a_stale_file_fails_the_check_and_says_how_to_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "table.json"
    target.write_text("old\n")
    assert _run(target, "--check") == 1
    assert "is stale: run gen --write" in capsys.readouterr().err
    assert target.read_text() == "old\n"  # a check never writes


def test_a_generate_error_is_exit_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "table.json"
    assert _run(target, "--write", fail=True) == 2
    assert "error: the jars are not cached" in capsys.readouterr().err
    assert not target.exists()


def test_write_or_check_is_required(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _run(tmp_path / "t", "--nothing")


def test_inputs_are_required_and_reach_generate(tmp_path: Path) -> None:
    seen: list[list[Path]] = []

    def generate(inputs: list[Path]) -> str:
        seen.append(inputs)
        return "generated\n"

    def run(*argv: str) -> int:
        return write_or_check(
            list(argv), path=tmp_path / "t", generate=generate, command="gen", description=None, inputs="jars"
        )

    with pytest.raises(SystemExit):
        run("--write")
    assert run("--write", "a.jar", "b.jar") == 0
    assert seen == [[Path("a.jar"), Path("b.jar")]]
