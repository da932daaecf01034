"""Rules readable from afar: every "rule N" a comment or docstring cites exists where it
points, and no docstring says only a rule's number.

Modules state their rules as numbered items in their docstring ("Rules:", "Failure
rules:", ...; docs/ARCHITECTURE.md, "Rules and citations"). A citation is written

- `rule N` (or `rules N-M`, `rules N, M and K`): a rule of the citing module itself; a
  module whose docstring numbers no rules cites its package's (engine/speculative/'s
  modules share the package's rules);
- `<module> rule N`, `<module> failure rule N`, `rule N of <module>`: a rule of another
  module, named by its path (`kv/paged.py`, `core/images.py`), its package folder
  (`engine/speculative/`) or its bare name (`registry`, `hub`); a name several modules
  share means the one nearest the citing file.

The check reads every module of the package (and the UI's scripts, which cite the
daemon's modules); a word before "rule" that names no module is not a citation.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import frink_mlx

PACKAGE = Path(frink_mlx.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
SCRIPTS = sorted((PACKAGE / "ui").glob("*.js"))

NUMS = r"\d+(?:\s*(?:[-–,]|\band\b|\bor\b)\s*\d+)*"
MODULE = r"[A-Za-z_][\w/.]*[\w/]"
NAMED = re.compile(rf"(?<![\w/.])(?P<mod>{MODULE})(?:\s+(?P<section>failure|response))?"
                   rf"\s+rules?\s+(?P<nums>{NUMS})", re.I)
OF = re.compile(rf"\brules?\s+(?P<nums>{NUMS})\s+of\s+(?P<mod>{MODULE})", re.I)
BARE = re.compile(rf"\brules?\s+(?P<nums>{NUMS})", re.I)
ITEM = re.compile(r"^\s*(\d+)\.\s", re.M)
SECTION = re.compile(r"^\s*(?P<name>[A-Za-z][\w -]*?\s+)?rules\b[^\n]*:\s*$", re.I | re.M)


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


DOCS = {path: _docstring(path) for path in SOURCES}


def _numbers(text: str) -> set[int]:
    found: set[int] = set()
    for part in re.split(r"\s*(?:,|\band\b|\bor\b)\s*", text):
        ends = [int(n) for n in re.split(r"\s*[-–]\s*", part.strip()) if n.isdigit()]
        found |= set(range(ends[0], ends[-1] + 1)) if ends else set()
    return found


def _rules(path: Path, section: str = "") -> set[int]:
    """The numbered items of `path`'s docstring; with `section` ("failure"), that list's."""
    doc = DOCS[path]
    heads = list(SECTION.finditer(doc))
    for i, head in enumerate(heads):
        if section and (head.group("name") or "").strip().lower() == section:
            end = heads[i + 1].start() if i + 1 < len(heads) else len(doc)
            return {int(n) for n in ITEM.findall(doc[head.end():end])}
    return {int(n) for n in ITEM.findall(doc)}


def _relative(path: Path) -> str:
    return "/" + path.relative_to(PACKAGE).as_posix()


def _named(name: str, source: Path) -> list[Path]:
    """The modules `name` may mean, nearest to `source` first (several only on a tie)."""
    name = name.removeprefix("frink_mlx/").rstrip(".")
    if name.endswith("/"):
        found = [p for p in SOURCES if _relative(p).endswith(f"/{name}__init__.py")]
    elif name.endswith(".py") or "/" in name:
        want = name if name.endswith(".py") else name + ".py"
        found = [p for p in SOURCES if _relative(p).endswith("/" + want)]
    else:
        bare = name.lower()
        found = [p for p in SOURCES if p.stem == bare or
                 (p.name == "__init__.py" and p.parent.name == bare and p.parent != PACKAGE)]
    if not found:
        return []

    def shared(path: Path) -> int:  # leading path parts in common with the citing file
        count = 0
        for mine, theirs in zip(path.parts, source.parts):
            if mine != theirs:
                break
            count += 1
        return count

    best = max(shared(p) for p in found)
    return [p for p in found if shared(p) == best]


def _own_rules(path: Path) -> set[int]:
    """A bare citation's rules: the module's own, else (none numbered) its package's."""
    own = _rules(path)
    package = path.parent / "__init__.py"
    if own or path.name == "__init__.py" or package not in DOCS:
        return own
    return _rules(package)


def _line(text: str, start: int) -> int:
    return text.count("\n", 0, start) + 1


def _citations(path: Path) -> list[tuple[int, str, Path | None, set[int], str]]:
    """(line, citation, module cited or None when ambiguous, numbers, section)."""
    text = path.read_text()
    found: list[tuple[int, str, Path | None, set[int], str]] = []
    taken: list[range] = []
    for pattern in (OF, NAMED):
        for m in pattern.finditer(text):
            targets = _named(m.group("mod"), path)
            if m.group("mod").lower() in ("module", "this"):
                targets = [path]
            if not targets:
                continue
            section = (m.groupdict().get("section") or "").lower()
            found.append((_line(text, m.start()), m.group(0),
                          targets[0] if len(targets) == 1 else None,
                          _numbers(m.group("nums")), section))
            taken.append(range(m.start(), m.end()))
    if path.suffix == ".py":
        for m in BARE.finditer(text):
            if not any(m.start() in span for span in taken):
                found.append((_line(text, m.start()), m.group(0), path,
                              _numbers(m.group("nums")), "own"))
    return found


def test_every_cited_rule_exists_where_it_points() -> None:
    missing: list[str] = []
    for path in SOURCES + SCRIPTS:
        for line, cited, target, numbers, section in _citations(path):
            where = f"{path.relative_to(PACKAGE)}:{line}: {cited!r}"
            if target is None:
                missing.append(f"{where} names several modules")
                continue
            have = _own_rules(target) if section == "own" else _rules(target, section)
            if numbers - have:
                missing.append(f"{where} -> {target.relative_to(PACKAGE)} has no rule "
                               f"{sorted(numbers - have)}")
    assert missing == []


def test_the_citation_reader_reads_every_form() -> None:
    """The check above is only as good as this reading."""
    hub = PACKAGE / "serving" / "hub.py"
    forms = {"registry rule 10": "registry.py", "kv/paged.py rule 2": "engine/kv/paged.py",
             "engine/speculative/ rule 7": "engine/speculative/__init__.py",
             "engine.py failure rule 3": "engine/engine.py", "rule 7 of handles.py":
             "serving/handles.py", "residency rule 6": "serving/residency.py"}
    for text, module in forms.items():
        m = OF.search(text) or NAMED.search(text)
        assert m is not None, text
        assert _named(m.group("mod"), hub) == [PACKAGE / module], text
    assert _numbers("1-3, 7 and 9") == {1, 2, 3, 7, 9}
    assert _rules(PACKAGE / "engine" / "engine.py", "failure") == {1, 2, 3}
    assert _named("translate", PACKAGE / "adapters" / "ollama" / "__init__.py") == \
        [PACKAGE / "adapters" / "ollama" / "translate.py"]


ONLY_A_NUMBER = re.compile(r"(?:[\w/.]+\s+)?rules?\s+[\d\s,and\-–]+(?:\([^)]*\))?\.?", re.I)


def test_no_docstring_says_only_a_rules_number() -> None:
    """"Rule 6." makes a reader open the module docstring; the docstring says the rule."""
    bare = [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"
            for path in SOURCES for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and ONLY_A_NUMBER.fullmatch((ast.get_docstring(node) or "").strip())]
    assert bare == []
