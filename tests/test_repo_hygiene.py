"""The repository speaks for itself: no tracked file refers to the tools or machines it was developed with, to
issue-tracker numbers, or to paths outside the repository. Each pattern is narrow enough that ordinary prose
("tests carry the gpu marker", pytest's session scope, an HTTP client session) does not match it.
"""
from __future__ import annotations

import codecs
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve().relative_to(ROOT).as_posix()  # its negative examples use allowed words

FORBIDDEN = {
    # character classes keep this file's own text from spelling out what it forbids
    "a development tool": re.compile(r"\b(?:d[e]vice|g[p]u)[ _-]t[o]ol\b|\bf[i]les_at\b|\$\{?O[U]T\b", re.IGNORECASE),
    "files carried to a machine": re.compile(
        r"\bcarr(?:y|ies|ied|ying)\b[^\n]{0,60}\b(?:wheels?|parts?|\.whl|machine|calls?)\b"
        r"|\b(?:wheels?|parts?|\.whl)\b[^\n]{0,40}\bcarr(?:y|ies|ied|ying)\b", re.IGNORECASE),
    "a work session": re.compile(
        r"\b(?:this|previous|second|first|next|last|earlier|later|one|each|a)\s+(?:work\s+|dev\s+)?session(?:'s|s)?\b"
        r"(?![ -](?:scope|scoped|fixture))", re.IGNORECASE),
    "notes for helpers": re.compile(r"HELPERS\.md|\bhelpers?\s+H\d\b|\b(?:other|parallel)\s+helpers\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues?\s*#?\d+\b|\bissue\s+#", re.IGNORECASE),
    "a path outside the repository": re.compile(r"\.\.[/]sh[a]red\b|/w[o]rk/(?:m[a]in|sh[a]red|wt|venv)\b"),
    "a machine kind": re.compile(r"\bnvidia-h\d{3}\b|\bh\d{3}-x\d\b", re.IGNORECASE),
    "a development-only name": re.compile(r"\bvllm-p[e]er\b|\bgpu-wh[e]els\b", re.IGNORECASE),
}


def tracked_text_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc})")
    paths = [p for p in listed.stdout.decode().split("\0") if p and p != THIS_FILE]
    return [p for p in paths if (ROOT / p).is_file() and b"\0" not in (ROOT / p).read_bytes()[:8192]]


def find_mentions(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, line) for every forbidden mention in `text`."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            if pattern.search(line):
                found.append((number, what, line.strip()[:160]))
    return found


def test_no_tracked_file_mentions_development_tools_or_outside_paths():
    problems = []
    for path in tracked_text_files():
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        problems += [f"{path}:{n}: {what}: {line}" for n, what, line in find_mentions(text)]
    assert not problems, "tracked files mention what the repository must not:\n" + "\n".join(problems)


# Lines each pattern must catch, stored in rot13 so that this file does not itself say what it forbids.
CAUGHT_EXAMPLES = [codecs.decode(line, "rot13") for line in [
    'Ybtf tb gb $BHG jura frg',
    'zrnfherq guebhtu gur qrivpr gbby',
    'gur jurryf pneevrq va .juy/freir',
    'gur TTHS vf pneevrq va gjb cnegf',
    "guvf frffvba'f svir ehaf",
    'frpbaq frffvba',
    "Vffhr 7'f purpx",
    '(vffhr 6, 2026-11-29)',
    'frr ../funerq/ORAPUZNEX.zq',
    'xvaq aivqvn-u200-k2',
    'cvc vafgnyy tch-jurryf',
    'ernq qbpf/URYCREF.zq',
]]


@pytest.mark.parametrize("line", CAUGHT_EXAMPLES)
def test_patterns_catch_what_they_are_for(line: str):
    assert find_mentions(line), line


@pytest.mark.parametrize("line", [
    "tests that need compiled kernels carry the `gpu` marker", '@pytest.fixture(scope="session")',
    "Fixtures (all session-scoped, written once per test session)", "async with aiohttp.ClientSession() as session:",
    "every output carries the full text so far", "shared helpers for comparing nv against HF",
    "One NVIDIA H200 (143 GB)", "see the issue tracker", "a step carries at most max_num_batched_tokens",
])
def test_patterns_leave_ordinary_prose_alone(line: str):
    assert not find_mentions(line), line
