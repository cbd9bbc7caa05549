"""Every command the docs show runs in a test (issue 40: "docs people read"): the `bash` blocks of the README and of
each page of the site, in their order, in one scratch folder holding files shaped like a user's; then each command's
--help example. A block's marker says how (tests/helpers/docs_blocks.py; docs/reference/development.md for readers):
run as written, run with a smaller budget or a CPU-sized model, or parsed by the real command line where it needs
GPUs, a server or the network. A block without a marker fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.docs_blocks import ROOT, Block, bash_blocks, command_of, tuner_argv, with_options
from tests.helpers.seq2seq_data import long_tail_lengths, save_tokenizer, write_jsonl
from tuner.settings import load_settings

BIN = Path(sys.executable).parent
SEED = ROOT / "tests" / "data" / "seed"
#: included as they are, not run: records whose commands are the recipes of their own sections (benchmarks: hours)
RECORDS = frozenset({"benchmarks.md", "DESIGN-NOTES.md", "COMPAT.md"})
COMMAND_TIMEOUT_S = 600
#: the --help examples a CPU runner cannot run as written (a hub model on 4 GPUs, 2 hours, a server that stays up):
#: run with these options set, or parsed (None)
HELP_EXAMPLES_WITH: dict[str, list[tuple[str, str]] | None] = {
    "explain": [
        ("--model", "builtin:tiny-t5"),
        ("--world-size", "1"),
        ("--device-memory", "160MiB"),
        ("--max-length", "32"),
        ("--max-target-length", "16"),
    ],
    "search": [
        ("--model", "builtin:tiny-t5"),
        ("--world-size", "1"),
        ("--device-memory", "160MiB"),
        ("--max-length", "32"),
        ("--max-target-length", "16"),
        ("--budget", "1m30s"),
        ("--n-trials", "3"),
    ],
    "serve": None,
}


def pages() -> list[Path]:
    """The README, then the site's pages in their navigation order."""

    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in walk(item)]
        if isinstance(node, dict):
            return [p for value in node.values() for p in walk(value)]
        return []

    nav = walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    return [ROOT / "README.md", *(ROOT / "docs" / p for p in nav if p not in RECORDS)]


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in bash_blocks(page)]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A folder with a user's files: the seed team's DeepSpeed JSON, training args and OOM text; a long-tail seq2seq
    data.jsonl with its tokenizer in tok/; the repository's examples/. Its own SQLite storage."""
    d = tmp_path_factory.mktemp("docs")
    for name in ("ds_config.json", "training_args.json", "oom.txt"):
        shutil.copy(SEED / name, d / name)
    write_jsonl(d / "data.jsonl", long_tail_lengths(2000, tail=(60, 90)))
    save_tokenizer(d / "tok")
    (d / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_") or k == "TUNER_CACHE_DIR"}
    env |= {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "TUNER_STORAGE": f"sqlite:///{d}/tuner.db",
        "COLUMNS": "100",
        "HF_HUB_OFFLINE": "1",
        # DeepSpeed's JIT ops (cpu_adam, shm comm) where the suite's probes build them, as tests/helpers/servers.py
        # does: the example's Trainer run otherwise compiled both again into torch's default ~/.cache/torch_extensions
        "TORCH_EXTENSIONS_DIR": str(load_settings().torch_extensions_dir),
    }
    return d, env


def _run(command: str, where: str, cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    assert done.returncode == 0, (
        f"{where}: `{command}` exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def _parse(block: Block) -> None:
    syntax = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
    assert syntax.returncode == 0, f"{block.where}: {syntax.stderr}"
    for command in block.commands:
        argv = tuner_argv(command)
        if argv is not None:
            try:
                command_of(argv)
            except Exception as err:  # click's usage errors: an option that is not there, a value it refuses
                pytest.fail(f"{block.where}: `{command}` does not parse: {err}", pytrace=False)


def test_every_bash_block_in_the_docs_has_a_marker() -> None:
    blocks = all_blocks()
    assert len(blocks) > 20  # the README and the guides: not an empty read
    unmarked = [b.where for b in blocks if b.marker is None]
    assert not unmarked, f"bash blocks without a docs-test marker (docs/reference/development.md): {unmarked}"
    for block in (b for b in blocks if (b.marker or "").startswith("run with ")):
        for option in block.options:  # each option a marker sets changes a command of its block: none is for show
            assert any(with_options(c, [option]) != with_options(c, []) for c in block.commands), (block.where, option)


def test_the_commands_the_docs_show_parse() -> None:
    """Cheap and first: every `tuner` command shown, run or not, is one the command line takes."""
    for block in all_blocks():
        if block.marker != "quickstart":
            _parse(block)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_every_command_in_the_docs_runs(sandbox: tuple[Path, dict[str, str]]) -> None:
    """The README's and the site's commands in reading order (later pages read the studies earlier ones made); a
    command already run word for word is not run again."""
    cwd, env = sandbox
    ran: set[str] = set()
    for block in all_blocks():
        if block.marker is None or not block.marker.startswith("run"):
            continue
        for command in block.commands:
            final = with_options(command, block.options) if block.options else command
            if final not in ran:
                _run(final, block.where, cwd, env)
                ran.add(final)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_each_commands_help_example_runs(sandbox: tuple[Path, dict[str, str]]) -> None:
    """`tuner COMMAND --help` ends with an example: each runs (in `tuner --help`'s order, so the search comes before
    what reads its study), or with HELP_EXAMPLES_WITH's options where a CPU runner cannot run it as written."""
    import typer

    from tuner.cli.app import COMMAND_ORDER, _register, app

    _register()
    root = typer.main.get_command(app)
    cwd, env = sandbox
    for name in COMMAND_ORDER:
        command = root.commands[name]  # type: ignore[attr-defined]
        found = [command, *getattr(command, "commands", {}).values()]
        for example in (e.removeprefix("Example: ") for c in found for e in (c.epilog or "").split("\n\n") if e):
            block = Block(f"tuner {name} --help", 0, example, "run")
            options = HELP_EXAMPLES_WITH.get(name, [])
            if options is None:
                _parse(block)
                continue
            _run(with_options(example, options) if options else example, block.where, cwd, env)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_quick_start_runs_and_its_test_command_is_the_ci_one(tmp_path: Path) -> None:
    """The README's two quick-start commands: scripts/quickstart.sh runs (its install step left out: this environment
    is installed; a 1-minute budget for its 2 minutes) and prints a DeepSpeed JSON; scripts/test.sh is what .ci/run
    runs."""
    (block,) = [b for b in bash_blocks(ROOT / "README.md") if b.marker == "quickstart"]
    quickstart, test = (c.split("#")[0].strip() for c in block.commands)
    assert quickstart == "scripts/quickstart.sh" and test == "scripts/test.sh"
    assert "exec scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_") or k == "TUNER_CACHE_DIR"}
    env |= {"TUNER_QUICKSTART_INSTALL": "0", "BUDGET": "1m", "TUNER_STORAGE": f"sqlite:///{tmp_path}/tuner.db"}
    done = subprocess.run([ROOT / quickstart], cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert '"train_micro_batch_size_per_gpu"' in done.stdout and "trial" in done.stdout
