"""Every command README.md, docs/ and bench/README.md show is checked as written.

A doc that drifts from the CLI fails the build. Commands are taken from
shell code blocks (``sh``, ``bash``, ``shell``, ``console``) and from inline
code that starts with one of our programs. Each one is then:

- **parsed** by the real argument parser of the program it names (the
  ``mistralrs-gateway`` verbs, ``python -m`` modules, ``make`` targets): every
  verb, flag and value the doc shows must be accepted;
- **run**, when it is quick and its inputs exist in the repository (schema,
  launch-plan on deploy/, bundle-digest, the docs generator, kustomize when
  kubectl is on the machine): it must exit 0; a file of the repository a
  command names must exist;
- or, for programs that are not ours (``curl``, ``docker``, ``jq`` …), named in
  :data:`EXTERNAL` with why it is not run here; a command of an unknown
  program fails the test until it is classified.

Placeholders in docs (``<dir>``, ``[--host H]``, ``tiny|small``, ``…``) are
read as the doc means them: an optional group is checked left out and given,
each alternative is checked, a named placeholder takes the value
:data:`PLACEHOLDERS` or :data:`WORDS` gives; every command of a ``&&`` chain
is checked.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
#: inline code that starts with one of these is a command
_OURS = ("mistralrs-gateway ", "make ", "python -m ", ".venv/bin/python -m ", "python3 -m ")
#: programs that are not ours: shown in docs, not run by this test (why)
EXTERNAL = {
    "curl": "examples against a running gateway; docs/callers.md runs its own",
    "docker": "no Docker engine on this machine (the client only)",
    "jq": "reads another command's output",
    "kubectl": "run below only as `kubectl kustomize`, when kubectl is installed",
    "openssl": "run by the guide that shows it",
    "sha256sum": "inside a container command",
    "cargo": "builds the worker image (deploy/worker)",
    "export": "sets the shell's environment for the commands after it",
    "pip": "installs a package",
    "cd": "changes directory",
    "pytest": "the test files named exist (below); make test runs them",
    "for": "a shell loop over a cluster's pods (kubectl)",
    "done": "ends that loop",
}
#: pages whose shell blocks are scripts (heredocs, variables, servers they
#: start and stop), each run whole by the test named; here only their
#: ``mistralrs-gateway`` commands are taken from those blocks
RUN_WHOLE = {
    "docs/callers.md": "tests/integration/test_claude_code.py",
    "docs/identity.md": "tests/test_docs_identity.py",
    "docs/worker-image.md": "tests/test_worker_image.py",
}
PLACEHOLDERS = {"<dir>": "bundle", "<worker-image>": "worker-image"}
#: whole-word placeholders of the README's command table
WORDS = {
    "DIR": "{bundle}",
    "FILE": "{bundle}/config.json",
    "T": "acme",
    "N": "1",
    "P": "1",
    "H": "127.0.0.1",
    "S": "inference",
    "URL": "http://127.0.0.1",
    "L": "locator",
}
_PYTHONS = {"python", "python3", ".venv/bin/python"}
#: mistralrs-gateway verbs that are run for real when their files exist
_RUNNABLE_VERBS = {"schema", "launch-plan", "bundle-digest", "check"}
#: python -m modules that are run for real (quick, no argparse of their own)
_RUNNABLE_MODULES = {"gateway.tools.docgen", "gateway.tools.layout"}


@dataclass(frozen=True)
class Command:
    doc: str
    text: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"{self.doc}: {self.text}"


def _shell_lines(markdown: str) -> list[str]:
    lines, block, pending = [], False, ""
    for line in markdown.splitlines():
        fence = re.match(r"^\s*```(\w*)", line)
        if fence:
            block = not block and fence.group(1) in _SHELL_BLOCKS
            continue
        if not block:
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line and not line.startswith(("#", "→")):
            lines.append(line.removeprefix("$ "))
    return lines


def _inline(markdown: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", prose)
    return [s.replace("\\|", "|") for s in spans if s.startswith(_OURS)]


def _variants(text: str, bundle: Path) -> list[str]:
    """The command without its optional groups and with them (``[--host H]``
    left out, then given), ellipses as a value, named placeholders filled in."""
    for name, value in PLACEHOLDERS.items():
        text = text.replace(name, value.format(bundle=bundle))
    bare = full = text
    while True:  # innermost groups first
        shorter = re.sub(r"\s*\[[^\[\]]*\]", "", bare)
        unwrapped = re.sub(r"\[([^\[\]]*)\]", r"\1", full)
        if shorter == bare and unwrapped == full:
            break
        bare, full = shorter, unwrapped
    return list(dict.fromkeys(v.replace("…", "1") for v in (bare, full)))


def _segments(tokens: list[str]) -> list[list[str]]:
    """The commands of a line: each side of ``&&``, ``||`` and ``;``, the first
    of a pipeline, nothing after a redirection."""
    segments: list[list[str]] = [[]]
    skipping = False
    for token in tokens:
        if token in {"&&", "||", ";"}:
            segments.append([])
            skipping = False
        elif token in {"|", ">", ">>"} or re.fullmatch(r"\d?>>?(&\d)?", token):
            skipping = True
        elif not skipping:
            segments[-1].append(token)
    return [s for s in segments if s]


def _alternatives(tokens: list[str]) -> list[list[str]]:
    """``tiny|small``: one argv per alternative (the others at their first)."""
    first = [t.split("|", 1)[0] for t in tokens]
    out = [first]
    for i, token in enumerate(tokens):
        for choice in token.split("|")[1:] if "|" in token else []:
            out.append([*first[:i], choice, *first[i + 1 :]])
    return out


def _commands(bundle: Path) -> list[Command]:
    found: list[Command] = []
    for path in DOCS:
        markdown = path.read_text()
        doc = path.relative_to(REPO).as_posix()
        lines = _shell_lines(markdown)
        if doc in RUN_WHOLE:
            lines = [line for line in lines if line.startswith("mistralrs-gateway ")]
        for text in [*lines, *_inline(markdown)]:
            for variant in _variants(text, bundle):
                for segment in _segments(shlex.split(variant, comments=True)):
                    if doc in RUN_WHOLE and segment[0] != "mistralrs-gateway":
                        continue
                    found += _argvs(doc, text, segment, bundle)
    return list(dict.fromkeys(found))


def test_pages_run_whole_have_their_test() -> None:
    for doc, test in RUN_WHOLE.items():
        assert (REPO / doc).is_file(), doc
        assert doc.removeprefix("docs/") in (REPO / test).read_text(), (doc, test)


def _argvs(doc: str, text: str, tokens: list[str], bundle: Path) -> list[Command]:
    env = []
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        name, _, value = tokens.pop(0).partition("=")
        env.append((name, value))
    found = []
    for choice in _alternatives(tokens) if tokens else []:
        argv = tuple(WORDS[t].format(bundle=bundle) if t in WORDS else t for t in choice)
        if len(argv) == 2 and argv[0] == "mistralrs-gateway":
            argv = (*argv, "--help")  # a verb named in prose: it must exist
        found.append(Command(doc, text, argv, tuple(env)))
        if argv[:2] == ("kubectl", "exec") and "--" in argv:
            inner = argv[argv.index("--") + 1 :]
            if inner[:1] == ("mistralrs-gateway",):
                found.append(Command(doc, text, inner))
    return found


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bundle")
    (directory / "config.json").write_text("{}")
    return directory


@pytest.fixture(scope="module")
def commands(bundle: Path) -> list[Command]:
    found = _commands(bundle)
    assert len(found) > 20, "fewer commands than the docs show: is the extraction broken?"
    return found


def _program(command: Command) -> str:
    program = command.argv[0]
    if program in _PYTHONS and command.argv[1:2] == ("-m",):
        return "python -m"
    return program


def test_every_command_is_of_a_known_program(commands: list[Command]) -> None:
    known = {"mistralrs-gateway", "python -m", "make", *EXTERNAL}
    unknown = [str(c) for c in commands if _program(c) not in known]
    assert unknown == []


# Parse-only: argparse.parse_args exits 0 once it accepted the argv, so the
# program never runs; a module with no parse_args of its own is not run here.
_SHIM = r"""
import argparse, json, runpy, sys
results = []
original = argparse.ArgumentParser.parse_args
def parsed(self, args=None, namespace=None):
    original(self, args, namespace)
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parsed
for target, argv in json.loads(sys.argv[1]):
    try:
        if target == "mistralrs-gateway":
            from gateway.tools.cli import main
            main(argv)
        else:
            sys.argv = [target, *argv]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        results.append("not parsed")
    except SystemExit as exc:
        results.append(exc.code or 0)
print(json.dumps(results))
"""


def _parse_target(command: Command) -> tuple[str, list[str]] | None:
    argv = list(command.argv)
    if argv[0] == "mistralrs-gateway":
        return "mistralrs-gateway", argv[1:]
    if _program(command) == "python -m":
        module = argv[2]
        if module in _RUNNABLE_MODULES:
            return None
        return module, argv[3:]
    return None


def test_every_command_parses_with_the_real_parser(commands: list[Command]) -> None:
    targets = [(c, t) for c in commands if (t := _parse_target(c)) is not None]
    # the simulator verb hands the rest of its argv to the simulator's own parser
    targets += [
        (c, ("gateway.testing.simulator", list(c.argv[2:])))
        for c in commands
        if c.argv[:2] == ("mistralrs-gateway", "simulator")
    ]
    assert targets
    for command, (module, _) in targets:
        if module != "mistralrs-gateway":
            spec_path = REPO / (module.replace(".", "/") + ".py")
            main_path = REPO / module.replace(".", "/") / "__main__.py"
            source = spec_path if spec_path.exists() else main_path
            assert source.exists(), f"no such module: {command}"
    done = subprocess.run(
        [sys.executable, "-c", _SHIM, json.dumps([t for _, t in targets])],
        cwd=REPO,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    results = json.loads(done.stdout.decode().splitlines()[-1])
    failed = [str(c) for (c, _), code in zip(targets, results, strict=True) if code != 0]
    assert failed == [], done.stderr.decode(errors="replace")[-3000:]


_REPO_DIRS = ("deploy/", "fixtures/", "docs/", "policies/", "bench/", "tests/", "gateway/")


def test_files_of_the_repository_that_commands_name_exist(commands: list[Command]) -> None:
    named = {
        (str(c), arg.split("=", 1)[-1])
        for c in commands
        if _program(c)
        in {"mistralrs-gateway", "python -m", "make"}  # kubectl's deploy/x is a resource
        for arg in c.argv[1:]
        if arg.split("=", 1)[-1].startswith(_REPO_DIRS)
    }
    assert named, "no command names a file of the repository: is the check broken?"
    missing = sorted(f"{where}: {name}" for where, name in named if not (REPO / name).exists())
    assert missing == []


def test_make_targets_exist(commands: list[Command]) -> None:
    targets = {c.argv[1] for c in commands if c.argv[0] == "make" and len(c.argv) > 1}
    assert {"demo", "test"} <= targets
    makefile = (REPO / "Makefile").read_text()
    missing = [t for t in targets if not re.search(rf"^{re.escape(t)}:", makefile, re.M)]
    assert missing == []


def _runnable(command: Command) -> bool:
    argv = command.argv
    if argv[0] == "mistralrs-gateway" and argv[1] in _RUNNABLE_VERBS:
        files = [a for a in argv[2:] if "/" in a or a.endswith((".yaml", ".yml"))]
        return all((REPO / f).exists() for f in files)
    if _program(command) == "python -m":
        return argv[2] in _RUNNABLE_MODULES
    return argv[:2] == ("kubectl", "kustomize") and shutil.which("kubectl") is not None


def test_quick_commands_run_and_exit_0(commands: list[Command]) -> None:
    runnable = [c for c in commands if _runnable(c)]
    # what must at least be run: the reference generator and a deploy launch plan
    shown = {" ".join(c.argv[:3]) for c in runnable}
    assert "python -m gateway.tools.docgen" in {s.removeprefix(".venv/bin/") for s in shown}
    assert any(c.argv[:2] == ("mistralrs-gateway", "launch-plan") for c in runnable)
    bin_dir = Path(sys.executable).parent
    for command in runnable:
        argv = list(command.argv)
        if argv[0] == "mistralrs-gateway":
            argv[0] = str(bin_dir / "mistralrs-gateway")
        elif argv[0] in _PYTHONS:
            argv[0] = sys.executable
        done = subprocess.run(
            argv,
            cwd=REPO,
            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(REPO), **dict(command.env)},
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"{command}\n{done.stderr.decode(errors='replace')[-2000:]}"
