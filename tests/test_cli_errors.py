"""Every bad command-line argument gets a one-line error naming it, exit code 2, no traceback,
and nothing created; the help texts say each thing once and agree with the README."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

BAD = [
    (["demo", "--target", "/nonexistent", "--draft", "/nonexistent"], "target: no such folder: '/nonexistent'"),
    (["bench", "--target", "/nonexistent", "--draft", "/nonexistent"], "target: no such folder: '/nonexistent'"),
    (["bench", "--rules", "nope"], "rule: unknown rule 'nope'"),
    (["bench", "--rules", "token", "nope"], "rule: unknown rule 'nope'"),
    (["bench", "--device", "nonsense"], "device: expected a torch device such as 'cpu' or 'cuda', got 'nonsense'"),
    (["bench", "--trees", "--sizes", "0"], "sizes: expected an int >= 2, got 0"),
    (["bench", "--trees", "--quick", "--sizes", "0"], "sizes: expected an int >= 2, got 0"),  # explicit wins
    (["bench", "--trees", "--temperatures", "-1"], "temperature: expected a finite value >= 0"),
    (["bench", "--trees", "--num-prompts", "-1"], "num_prompts: expected an int >= 1, got -1"),
    (["bench", "--trees", "--max-new-tokens", "0"], "max_new_tokens: expected an int >= 1, got 0"),
    (["bench", "--temperatures", "-1"], "temperature: expected a finite value >= 0"),
    (["bench", "--num-prompts", "-1"], "num_prompts: expected an int >= 1, got -1"),
    (["bench", "--quick", "--sizes", "0"], "unrecognized arguments: --sizes 0"),
    (["info", "--bogus", "foo"], "unrecognized arguments: --bogus foo"),
    (["install-models", "llama"], "unknown model(s) llama; expected smollm2 and/or gemma3"),
    (["demo", "--gamma", "0"], "num_draft_tokens: expected an int >= 1, got 0"),
    (["nope"], "invalid choice: 'nope'"),
    (["prompts", "--target", "demo", "--out", "p.json"], "out: a prompt file's name ends with .jsonl.gz, got 'p.json'"),
    (["prompts", "--target", "demo", "--out", "p.jsonl.gz", "--mix", "templates=1,self-instruct=1"],
     "mix: templates are made when a run starts and are not stored in a prompt file"),
    (["prompts", "--target", "demo", "--out", "p.jsonl.gz", "--mix", "web=1"], "mix: expected SOURCE=SHARE"),
    (["prompts", "--target", "demo", "--out", "p.jsonl.gz", "--count", "0"], "count: expected an int >= 1, got 0"),
    (["prompts", "--target", "nowhere", "--out", "p.jsonl.gz"], "target: expected 'demo', 'smollm2', 'gemma3' or a Hugging"),
    (["prompts", "--target", "demo", "--out", "p.jsonl.gz", "--device", "nonsense"], "device: expected"),
    (["prompts", "--target", "demo"], "the following arguments are required: --out"),
    (["train", "draft", "--target", "demo", "--out", "D", "--prompts", "p.jsonl.gz"],
     "prompts: no such file 'p.jsonl.gz'"),
    (["train", "draft", "--target", "demo", "--out", "D", "--prompts", "p.txt"], "prompts: a prompt file"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_argument_is_one_line_exit_2_and_creates_nothing(argv: list[str], message: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m specdecode"), captured.err
    assert ": error: " in lines[0] and message in lines[0], lines[0]
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_train_refusing_an_option_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "exit", "--target", "demo", "--layer", "99", "--out", "DIR", "--threads", "1"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "exit_layer: expected an int in [1, 5]" in lines[0]
    assert not (tmp_path / "DIR").exists()


def test_train_refuses_a_prompt_file_it_cannot_use_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A prompt file as --data, or as --prompts without a --prompt-mix: refused before anything
    is loaded or made."""
    from specdecode.cli import main
    from specdecode.training.prompt_file import held_out_record, write_prompt_file

    monkeypatch.chdir(tmp_path)
    header = {"target": {"name": "demo", "weights_hash": "sha256:0"}, "held_out": held_out_record()}
    write_prompt_file("p.jsonl.gz", header, {"self-instruct": ["Plan a picnic for six people."]})
    for extra, message in ((["--data", "p.jsonl.gz"], "data: 'p.jsonl.gz' is a prompt file"),
                           (["--prompts", "p.jsonl.gz"], "prompts: a prompt file is drawn from by prompt_mix's"),
                           (["--prompts", "p.jsonl.gz", "--prompt-mix", "multi-turn=1"],
                            "prompts: 'p.jsonl.gz' holds no multi-turn prompts")):
        with pytest.raises(SystemExit) as exit_info:
            main(["train", "draft", "--target", "demo", "--out", "DIR", "--threads", "1", *extra])
        assert exit_info.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and message in lines[0], lines
    assert [p.name for p in tmp_path.iterdir()] == ["p.jsonl.gz"]


def test_a_folder_without_a_model_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A folder that exists but holds no model: refused once the loader looks, still in one line."""
    from specdecode.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(tmp_path)
    for command in ("demo", "bench"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--target", str(empty), "--draft", str(empty), "--max-new-tokens", "4"])
        assert exit_info.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and f"target_path: '{empty}' holds no Hugging Face model" in lines[0], lines
    assert [p.name for p in tmp_path.iterdir()] == ["empty"]


def test_no_traceback_from_a_real_process(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "specdecode", "demo", "--target", "/nonexistent", "--draft", "/x"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", [["specdecode.info"], ["specdecode", "info"]])
def test_output_into_a_closed_pipe_ends_quietly(module: list[str]) -> None:
    """``python -m specdecode.info | head -1``: no BrokenPipeError traceback."""
    proc = subprocess.run(f"{sys.executable} -m {' '.join(module)} | head -1", shell=True, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("specdecode ") and len(proc.stdout.splitlines()) == 1
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def _help(argv: list[str], capsys: pytest.CaptureFixture[str], flat: bool = True) -> str:
    from specdecode.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    return " ".join(out.split()) if flat else out


def test_help_texts_say_each_thing_once(capsys: pytest.CaptureFixture[str]) -> None:
    top = _help(["--help"], capsys, flat=False)
    for command in ("demo", "bench", "train", "prompts", "info"):  # once in the list of commands
        assert len(re.findall(rf"^ {{2,4}}{command} +\S", top, flags=re.MULTILINE)) == 1, (command, top)
    bench = _help(["bench", "--help"], capsys)
    assert "--trees" in bench and "--device" in bench
    rules = bench.rsplit("--rules RULE [RULE ...]", 1)[1].split(" --", 1)[0]  # its entry in the option list
    assert rules.count("default") == 1 and "(default: token block)" in rules, rules


def test_quick_takes_as_long_in_the_help_as_in_the_readme(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _help(["bench", "--help"], capsys)
    duration = re.search(r"--quick # the same pair, shorter: (about [a-z ]+?)\s", bench)
    assert duration is not None, bench
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    quick = [m.start() for m in re.finditer(r"bench --quick", readme)]
    assert quick and all(duration.group(1) in readme[i:i + 200] for i in quick), duration.group(1)
