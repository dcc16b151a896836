"""The README is a newcomer's page: short, opening with the two commands; the reference lives in
docs/, and every relative link in the README and docs/ points at a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

from mcpsync.worker.stack.common import REPO_ROOT

README = REPO_ROOT / "README.md"
TWO_COMMANDS = ["# mcpsync", "", "```sh", "scripts/up      #", "scripts/test    #", "```"]


def test_readme_is_a_newcomers_page_of_at_most_150_lines_opening_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines"
    opening = [line[:len(start)] for line, start in zip(lines, TWO_COMMANDS, strict=False)]
    assert opening == TWO_COMMANDS


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    broken = []
    for doc in [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", Path(file).read_text(), re.MULTILINE)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{doc.name}: {target}")
    assert broken == []
