"""What the README and docs/ write down holds: every command they name runs (`--help` for each subcommand, `--dry-run`
for each experiment file), every `--flag` they name is in the help of the command it is given for, the defaults and
choices they state for the main flags are the parser's, every link reaches a file and heading that exist, none of the
old `python -m mpi_train.X` forms is left, and one installed command runs."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import MPI_ENV, REPO

from mpi_train.cli import DEFAULT, SUBCOMMANDS
from mpi_train.commands.train import build_parser
from mpi_train.lab.experiment import main as experiment_main
from mpi_train.lr_schedule import MODEL_DEFAULTS, optimizer_defaults
from mpi_train.sync import COMPRESSORS, SYNC_METHODS, every_label
from mpi_train.sync.averaging import DEFAULT_PERIOD, ModelAveraging
from mpi_train.sync.diloco import DEFAULT_OUTER_LR, DEFAULT_OUTER_MOMENTUM

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:python -m mpi_train|mpi-train)\b((?: +[^\s`|;&]+)*)")
OLD_FORMS = re.compile(r"python -m mpi_train\.[a-z_]+|mpi-train-[a-z]")  # before one command had subcommands
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def documented() -> dict[str, set[str]]:
    """Each documented subcommand (train for a flag first), with the experiment files written after it."""
    found: dict[str, set[str]] = {}
    for path in DOCUMENTS:
        for rest in COMMAND.findall(path.read_text()):
            words = rest.split()
            name = words[0] if words and words[0] in SUBCOMMANDS else DEFAULT
            files = {word for word in words if word.endswith(".toml") and (REPO / word).is_file()}
            found.setdefault(name, set()).update(files)
    return found


def test_the_documents_name_the_commands():
    commands = documented()
    assert {"train", "experiment", "bench", "soak"} <= set(commands)
    assert "experiments/smoke.toml" in commands["experiment"]


def test_the_documents_name_no_old_form():
    old = [f"{path.name}: {match}" for path in DOCUMENTS for match in OLD_FORMS.findall(path.read_text())]
    assert not old, "old command forms (now python -m mpi_train SUBCOMMAND):\n" + "\n".join(old)


HELP_EACH = """
import contextlib, io, json, sys
from mpi_train.cli import main
helps = {}
for name in sys.argv[2:]:
    argv, out = ([name] if name != "-" else []) + ["--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    except SystemExit as end:
        code = end.code or 0
    helps[name] = [code, out.getvalue()]
    print(f"{name}\\t{code}", file=sys.stderr, flush=True)
with open(sys.argv[1], "w") as file:
    json.dump(helps, file)
"""


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """`mpi-train --help` ("-") and every subcommand's --help, in one process that imports torch once: each one's
    exit status and text."""
    answers = tmp_path_factory.mktemp("helps") / "helps.json"
    done = subprocess.run([sys.executable, "-c", HELP_EACH, str(answers), "-", *SUBCOMMANDS], cwd=REPO, text=True,
                          capture_output=True, env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)}, timeout=180,
                          check=False)
    assert done.returncode == 0 and answers.exists(), done.stderr[-3000:]
    return {name: (code, text) for name, (code, text) in json.loads(answers.read_text()).items()}


def test_every_documented_command_answers_help(helps):
    names = ["-", *sorted(documented())]
    answers = {name: (code, "usage:" in text) for name, (code, text) in helps.items() if name in names}
    assert answers == dict.fromkeys(names, (0, True))


@pytest.mark.parametrize("experiment_file", sorted({f for files in documented().values() for f in files}))
def test_every_documented_experiment_file_is_valid(experiment_file, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert experiment_main([experiment_file, "--dry-run"]) == 0, capsys.readouterr().err
    assert "run(s)" in capsys.readouterr().out


# Every --flag the documents name, held against the help of the command it is given for -------------------------------

OPTION = re.compile(r"^  (?:-\w, )?(--[a-z][a-z0-9-]*)", re.MULTILINE)  # an option's own line in argparse's help
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# What starts a command: this package's (also as torchrun's module or the Slurm script's arguments), or another
# program that the documents' command lines run around it
PROGRAM = re.compile(r"(?:python )?-m mpi_train\b|\bmpi-train\b|\bslurm/train\.sbatch\b|python -m pytest\b|\bpytest\b"
                     r"|\bmpirun\b|\bmpiexec\b|\btorchrun\b|\bsbatch\b|\bsrun\b|\bpip\b|\bdocker run\b"
                     r"|(?:python )?(?:scripts|tests)/[\w./-]+")
SEPARATOR = re.compile(r"\s#|\s\(|;|&&|\|\|?|\s>|\s--\s")  # what ends a command: a comment, prose, the next one
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(\[])")
QUOTED = re.compile(r'"([^"]*)"')  # a script's argument in quotes: training flags it passes on (grow_check.py)
TOP_LEVEL = {"--help", "--version"}  # `mpi-train --version`: the command's own, before any subcommand
# The flags of the other programs, as the documents use them; the repository's scripts are read for their own
OTHER_PROGRAMS = {
    "mpirun": {"--allow-run-as-root", "--bind-to", "--hostfile", "--host", "--oversubscribe", "--mca", "--prtemca"},
    "torchrun": {"--standalone", "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                 "--max-restarts", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id"},
    "sbatch": {"--wait", "--ntasks-per-node", "--signal", "--requeue"},
    "srun": {"--mpi", "--kill-on-bad-exit", "--gpus-per-task"},
    "pytest": {"--durations"},
    "docker run": {"--cap-add", "--privileged"},
}
OTHER_PROGRAMS["mpiexec"] = OTHER_PROGRAMS["mpirun"]
ANY_OTHER = set().union(*OTHER_PROGRAMS.values())


def program_name(start: str) -> str:
    """This package's command as "mpi_train", `python scripts/x.py` as the script's path, the others by name."""
    if "mpi_train" in start or start in ("mpi-train", "slurm/train.sbatch"):
        return "mpi_train"
    if start in ("python -m pytest", "pytest"):
        return "pytest"
    return start.removeprefix("python ")


def segments(code: str):
    """(program or None, its words) for each command in one line of code: up to the next program or separator."""
    for piece in SEPARATOR.split(code):
        starts = list(PROGRAM.finditer(piece))
        if not starts or starts[0].start() > 0:
            yield None, piece[:starts[0].start()] if starts else piece
        for here, after in zip(starts, [*starts[1:], None]):
            yield program_name(here.group(0)), piece[here.end():after.start() if after else len(piece)]


def named_subcommand(code: str) -> str | None:
    """The subcommand a span of prose starts with: `bench`, `advise --memory-limit`, an error's `mpi_train supervise:`,
    or a command line's `python -m mpi_train advise-check`."""
    words = code.replace(":", " ").split()
    if words[:3] == ["python", "-m", "mpi_train"] or words[:1] in (["mpi-train"], ["mpi_train"]):
        words = words[3:] if words[0] == "python" else words[1:]
        return words[0] if words and words[0] in SUBCOMMANDS else (DEFAULT if words else None)
    return words[0] if words and words[0] in SUBCOMMANDS else None


def paragraphs(text: str):
    """(line number, text, whether it is code) of each paragraph outside code blocks (a table row or a list item is a
    paragraph of its own) and of each line of a code block (its `\\` continuations joined); toml blocks left out."""
    lines, number, fence, paragraph, start = text.splitlines(), 0, None, [], 0
    while number < len(lines):
        line = lines[number]
        opening = re.match(r"^```(\w*)", line)
        if fence is not None:
            if line.startswith("```"):
                fence = None
            elif fence != "toml":
                first = number
                while line.endswith("\\") and number + 1 < len(lines):
                    number += 1
                    line = line[:-1] + " " + lines[number]
                yield first + 1, line, True
        elif opening or not line.strip() or re.match(r"^\s*(\||- |\* |\d+\. |#)", line):
            if paragraph:
                yield start + 1, "\n".join(paragraph), False
            paragraph, start = ([line] if line.strip() and not opening else []), number
            fence = opening.group(1) if opening else None
        else:
            if not paragraph:
                start = number
            paragraph.append(line)
        number += 1
    if paragraph:
        yield start + 1, "\n".join(paragraph), False


def opening_subcommands(text: str) -> set[str]:
    """The subcommands a page's opening paragraph names: what its prose speaks of when a sentence names none."""
    for _, paragraph, code in paragraphs(text):
        if not code and not paragraph.startswith("#"):
            return {named for part in paragraph.split("`")[1::2] if (named := named_subcommand(part))}
    return set()


def misattributed_flags(text: str, options: dict[str, set[str]], name: str = "") -> list[str]:
    """Each `--flag` of a document that the command it is given for does not take, as "NAME:LINE: --flag (command)".

    On a command line a flag belongs to the command it follows: `python -m mpi_train bench ... --steps` to bench's
    help (a flag first: train's), `mpirun --bind-to` to OTHER_PROGRAMS, `python scripts/x.py --steps` to that
    script's source; code outside any command (a console's output, a comment) is left alone. In prose, a flag belongs
    to the subcommand its sentence named last before it (`bench`, `advise --fresh`, a sentence that opens with
    `python -m mpi_train advise-check`); else to train, or to a subcommand the page's opening paragraph names. Any
    prose flag may be one of the other programs'."""
    wrong, page = [], opening_subcommands(text)
    for line, paragraph, code in paragraphs(text):
        for sentence in [paragraph] if code else SENTENCE_END.split(" ".join(paragraph.split())):
            subject = None
            parts = [(sentence, True)] if code else [(part, index % 2 == 1)
                                                     for index, part in enumerate(sentence.split("`"))]
            for index, (part, is_code) in enumerate(parts):
                if not code and is_code and named_subcommand(part):
                    opens = index == 1 and not parts[0][0].strip(" *(-")
                    if opens or not PROGRAM.match(part.strip()):
                        subject = named_subcommand(part)
                allowed = (options[subject] if subject else set().union(*(options[each] for each in page | {DEFAULT})))
                allowed = allowed | ANY_OTHER
                for program, words in segments(part) if is_code else [(None, part)]:
                    flags = [flag.split("=")[0] for flag in FLAG.findall(words)]
                    if program == "mpi_train":
                        first = words.split()[:1]
                        command = first[0] if first and first[0] in SUBCOMMANDS else DEFAULT
                        takes = options[command] | (TOP_LEVEL if command == DEFAULT else set())
                        wrong += [f"{name}:{line}: {flag} ({command})" for flag in flags if flag not in takes]
                    elif program in OTHER_PROGRAMS:
                        wrong += [f"{name}:{line}: {flag} ({program})" for flag in flags
                                  if flag not in OTHER_PROGRAMS[program]]
                    elif program is not None:
                        # a script's own flags are in its source; a quoted value passes training flags on
                        script = REPO / program
                        source = script.read_text() if script.is_file() else ""
                        own = FLAG.findall(QUOTED.sub("", words))
                        passed = FLAG.findall(" ".join(QUOTED.findall(words)))
                        wrong += [f"{name}:{line}: {flag} ({program})" for flag in own if f'"{flag}"' not in source]
                        wrong += [f"{name}:{line}: {flag} ({DEFAULT})" for flag in passed
                                  if flag not in options[DEFAULT]]
                    elif not code:
                        wrong += [f"{name}:{line}: {flag} ({subject or DEFAULT})" for flag in flags
                                  if flag not in allowed]
    return wrong


def test_every_flag_the_documents_name_is_in_its_commands_help(helps):
    options = {name: set(OPTION.findall(text)) for name, (_, text) in helps.items() if name != "-"}
    assert all(options.values()), [name for name, found in options.items() if not found]
    wrong = [entry for path in DOCUMENTS for entry in misattributed_flags(path.read_text(), options, path.name)]
    assert not wrong, "flags the command they are given for does not take:\n" + "\n".join(wrong)


def test_the_flag_check_finds_a_flag_given_to_the_wrong_command():
    options = {name: set() for name in SUBCOMMANDS} | {"train": {"--sync"}, "bench": {"--steps"}}
    text = ("Train with `--sync ddp`.\n\n`bench` takes `--steps 5`, not `--sync`.\n\n"
            "```\nmpirun --bind-to none --hostfle hostfile python -m mpi_train bench --steps 3 --epochs 2\n```\n")
    assert misattributed_flags(text, options) == [":3: --sync (bench)", ":6: --hostfle (mpirun)",
                                                  ":6: --epochs (bench)"]


# The defaults and choices the documents state for the main flags, held against the parser's ---------------------------

ACTIONS = {option: action for action in build_parser()._actions for option in action.option_strings}
PER_MODEL = {"--optimizer": "optimizer", "--lr": "lr", "--momentum": "momentum", "--weight-decay": "weight_decay",
             "--warmup-steps": "warmup_steps"}  # flags whose default is the model's (lr_schedule.MODEL_DEFAULTS)
AVERAGING = inspect.signature(ModelAveraging.__init__).parameters  # what localsgd and diloco take when a flag is unset
METHOD_DEFAULTS = {"--period": DEFAULT_PERIOD, "--local-start-step": AVERAGING["local_start_step"].default,
                   "--host-period": AVERAGING["host_period"].default, "--local-momentum": AVERAGING["momentum"].default,
                   "--fragments": AVERAGING["fragments"].default, "--outer-lr": DEFAULT_OUTER_LR,
                   "--outer-momentum": DEFAULT_OUTER_MOMENTUM}
OTHER_MODEL = "resnet18"  # a model without defaults of its own
CODE_WORD = re.compile(r"`([\w-]+)`")


def flag_rows(text: str) -> dict[str, tuple[list[str], str, str]]:
    """The rows `| flags | default | meaning |` of a page's flag tables, by their first flag."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if len(cells) == 3 and cells[0].startswith("`--"):
            flags = re.findall(r"`(--[a-z][\w-]*)", cells[0])
            rows.setdefault(flags[0], (flags, cells[1], cells[2]))  # a flag's own row comes first
    return rows


def parser_default(flag: str):
    """What the flag takes when it is not given: the parser's default, or the method's a None stands for."""
    action = ACTIONS[flag]
    if action.nargs == 0:
        return "off" if action.default is False else "on"
    return METHOD_DEFAULTS.get(flag, action.default)


def same(stated: str, value) -> bool:
    stated = stated.strip("` ")
    if value is None:
        return stated == "none"
    if isinstance(value, str):
        return stated == value
    try:
        return float(stated) == float(value)
    except ValueError:
        return False


def wrong_defaults(rows: dict[str, tuple[list[str], str, str]]) -> list[str]:
    """Each stated default or choice that is not the parser's, as "--flag: stated, parser's"."""
    wrong = []
    for first, (flags, default, meaning) in rows.items():
        if first in PER_MODEL:
            field = PER_MODEL[first]
            pairs = re.findall(r"`?([\w.'+-]+)`? \(`(\w+)`", default)
            if {model for _, model in pairs} != set(MODEL_DEFAULTS):
                wrong.append(f"{first}: names the models {[model for _, model in pairs]}, not {list(MODEL_DEFAULTS)}")
            wrong += [f"{first}: {value} for {model}, the model's is {getattr(optimizer_defaults(model), field)}"
                      for value, model in pairs if not same(value, getattr(optimizer_defaults(model), field))]
            other = re.search(r"`?([\w.'+-]+)`? for any other", default)
            if other:
                stated, value = other.group(1), getattr(optimizer_defaults(OTHER_MODEL), field)
                model = stated.removesuffix("'s")
                expected = getattr(optimizer_defaults(model), field) if stated.endswith("'s") else stated
                if not same(str(expected), value):
                    wrong.append(f"{first}: {stated} for any other model, {OTHER_MODEL}'s is {value}")
            continue
        parts = [part for part in re.split(r",\s+|\s+/\s+", re.sub(r"\s*\([^)]*\)", "", default)) if part]
        for flag, stated in zip(flags, parts if len(parts) == len(flags) else parts[:1]):
            value = parser_default(flag)  # None: resolved when the job starts, as its help says
            if (value is not None or flag in METHOD_DEFAULTS) and not same(stated, value):
                wrong.append(f"{flag}: {stated}, the parser's {value}")
        choices = set(ACTIONS[first].choices or ())
        named, listed = set(CODE_WORD.findall(f"{default} {meaning}")), set(CODE_WORD.findall(meaning))
        if not choices <= named:
            wrong.append(f"{first}: choices {sorted(choices - named)} not named")
        if first == "--sync" and listed != choices:  # its row lists the methods, nothing else
            wrong.append(f"{first}: lists {sorted(listed - choices)} and not {sorted(choices - listed)}")
    return wrong


def test_the_defaults_and_choices_the_flag_tables_state_are_the_parsers():
    rows = {**flag_rows((REPO / "docs" / "training.md").read_text()),
            **flag_rows((REPO / "docs" / "tracking.md").read_text())}
    assert {"--sync", "--compression", "--warmup-steps", "--seed", "--eval-every", "--epochs", "--batch-size", "--lr",
            "--optimizer", "--period", "--experiment"} <= set(rows)
    assert not wrong_defaults(rows), "\n".join(wrong_defaults(rows))


def test_the_default_check_finds_a_stated_default_the_parser_does_not_have():
    rows = flag_rows("| `--batch-size` | 128 | global batch |\n| `--sync` | `allreduce` | `allreduce`, `ddp` |\n"
                     "| `--warmup-steps` | per model: 20 (`vgg11`), 20 (`mnist_cnn`), 50 (`gpt`) | ramp |\n"
                     "| `--overlap`, `--fragments F` | off, 2 | ... |")
    wrong = wrong_defaults(rows)
    assert wrong[:1] == ["--batch-size: 128, the parser's 256"] and "--fragments: 2, the parser's 1" in wrong
    assert "--warmup-steps: 20 for mnist_cnn, the model's is 40" in wrong
    assert [entry.split(":")[0] for entry in wrong].count("--sync") == 2  # zero, fsdp, ... neither named nor listed


def compression_carriers() -> tuple[set[str], dict[str, set[str]]]:
    """The methods that take --compression: those that carry every compression, and those that carry only some."""
    every, some = set(), {}
    for name, method in SYNC_METHODS.items():
        carried = set(method.traits.compressions) - {"none"}
        if method.traits.fixed_compression or not carried:
            continue
        if carried == set(COMPRESSORS) - {"none"}:
            every.add(name)
        else:
            some[name] = carried
    return every, some


def wrong_carriers(statement: str) -> list[str]:
    """Where a statement of which methods take --compression differs from the registry: the methods it names, and
    after a method that takes only some compressions (`zero` (`fp16`, `bf16`)), the ones it names for it."""
    every, some = compression_carriers()
    named = {word for word in re.findall(r"[a-z_0-9]+", statement) if word in SYNC_METHODS}
    wrong = [f"names {sorted(named)}, the registry's {sorted(every | set(some))}"] if named != every | set(some) else []
    for method, carried in some.items():
        clause = re.search(rf"\b{method}\b[^);.|]*", statement)
        said = set(re.findall(r"[a-z0-9]+", clause.group(0))) & set(COMPRESSORS) if clause else set()
        if said != carried:
            wrong.append(f"{method}: {sorted(said)}, the registry's {sorted(carried)}")
    return wrong


def sentence(text: str, start: str) -> str:
    """The sentence of `text` that begins at `start`."""
    rest = text[text.index(start):]
    return re.split(r"\.\s", rest, maxsplit=1)[0]


def test_which_methods_take_compression_is_said_as_the_registry_says():
    readme, sync_methods = (REPO / "README.md").read_text(), (REPO / "docs" / "sync-methods.md").read_text()
    statements = {"README": sentence(readme, "picks what the messages carry"),
                  "sync-methods.md": sentence(sync_methods, "**Compression** is a separate choice"),
                  "training.md": flag_rows((REPO / "docs" / "training.md").read_text())["--compression"][2],
                  "--help": ACTIONS["--compression"].help}
    wrong = {where: wrong_carriers(statement) for where, statement in statements.items()}
    assert not any(wrong.values()), wrong
    assert wrong_carriers("`allreduce`, `flat`, `bucketed`, `ring`, `hierarchical`")  # the check can fail


def test_what_seed_eval_every_and_warmup_steps_mean_is_said_as_the_help_and_the_code_say():
    rows = flag_rows((REPO / "docs" / "training.md").read_text())
    warmups = {model: int(steps) for steps, model in re.findall(r"(\d+) for (\w+)", ACTIONS["--warmup-steps"].help)}
    assert warmups == {model: optimizer_defaults(model).warmup_steps for model in MODEL_DEFAULTS}, warmups
    draws = re.compile(r"\((?:seed|augmentation)[^)]*\)")
    assert set(draws.findall(rows["--seed"][2])) == set(draws.findall(ACTIONS["--seed"].help)) == {
        "(seed, rank)", "(seed, rank, epoch)"}
    for said in (rows["--eval-every"][2], ACTIONS["--eval-every"].help):
        assert "wall time spent training so far" in said and "evaluations left out" in said, said


def test_the_readme_names_every_sync_method_and_the_bench_counts_every_label():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| `--sync` | in one line |"):]
    table = table[:table.index("\n\n")]
    names = {name for row in table.splitlines()[2:] for name in re.findall(r"`([\w-]+)`", row.split(" | ")[0])}
    assert names == set(SYNC_METHODS) | {"auto"}
    assert re.search(r"\((\d+) of them", readme).group(1) == str(len(SYNC_METHODS))
    bench = (REPO / "docs" / "sync-methods.md").read_text()
    assert re.search(r"that is (\d+) labelled methods", bench).group(1) == str(len(every_label()))


# Every link reaches a file, and a heading, that exist -----------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+\s+(.*)$", re.MULTILINE)
ANCHOR = re.compile(r'<a id="([^"]+)">')
CODE_ANCHOR = re.compile(r'(?:docs/([\w-]+\.md)|\{SOURCE\})#([a-z0-9-]+)')  # a link in code: SOURCE is results.md
CODE_TITLE = re.compile(r'docs/([\w-]+\.md)[\s#]*[(,][\s#]*\(?"([^"]+)"')  # a section named in code: x.md ("Title")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text, found, seen = path.read_text(), set(), {}
    for heading in HEADING.findall(re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}-{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found | set(ANCHOR.findall(text))


def titles(path: Path) -> set[str]:
    return {heading.replace("`", "").strip() for heading in HEADING.findall(path.read_text())}


def test_every_link_reaches_a_file_and_heading():
    broken = []
    for path in DOCUMENTS:
        for target in LINK.findall(path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists() or (anchor and anchor not in anchors(linked)):
                broken.append(f"{path.name}: {target}")
    code = [*(REPO / "mpi_train").rglob("*.py"), *(REPO / "scripts").glob("*"), *(REPO / "experiments").glob("*")]
    for path in code:
        text = path.read_text()
        for file, anchor in CODE_ANCHOR.findall(text):
            if anchor not in anchors(REPO / "docs" / (file or "results.md")):
                broken.append(f"{path.relative_to(REPO)}: {file or 'results.md'}#{anchor}")
        for file, title in CODE_TITLE.findall(text):
            title = re.sub(r"\s+#?\s*", " ", title).replace("`", "").strip()
            if not any(heading.startswith(title) for heading in titles(REPO / "docs" / file)):
                broken.append(f'{path.relative_to(REPO)}: {file} "{title}"')
    assert not broken, "links to nothing:\n" + "\n".join(broken)


# The installed command ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_every_console_command_points_at_a_function(command):
    module, _, function = SCRIPTS[command].partition(":")
    assert callable(getattr(importlib.import_module(module), function)), SCRIPTS[command]


def test_one_console_command():
    assert SCRIPTS == {"mpi-train": "mpi_train.cli:console_main"}


def test_an_installed_console_command_runs():
    path = os.path.join(os.path.dirname(sys.executable), "mpi-train")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: install the package (pip install -e .) so pip writes its command")
    result = subprocess.run([path, "predict", "--help"], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert result.returncode == 0 and "usage: python -m mpi_train predict" in result.stdout, result.stderr


@pytest.mark.e2e
def test_mpi_train_command_trains_under_mpirun(tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "mpi-train")
    result = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", command, "--dataset", "synthetic",
                             "--synthetic-size", "256", "--batch-size", "64", "--max-steps", "2", "--no-tracking"],
                            capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env={**os.environ, **MPI_ENV, "PYTHONPATH": str(REPO)},
                            check=False)
    assert result.returncode == 0, result.stderr
    assert "2 rank(s) on 1 host(s)" in result.stdout and "done in" in result.stdout
    # mpirun gives each rank a terminal of its own: still no live progress bar (reporter.py), the lines alone
    assert "\r" not in result.stdout and "\n\n" not in result.stdout and "ETA" not in result.stdout, result.stdout


def test_the_readme_is_short_and_its_command_table_names_every_subcommand():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    table = text[text.index("## Commands"):text.index("## Documentation")]
    assert all(f"`{name}`" in table for name in SUBCOMMANDS), [name for name in SUBCOMMANDS if f"`{name}`" not in table]
