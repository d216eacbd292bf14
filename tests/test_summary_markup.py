"""summary.md as Markdown: text from the job (an exception's message, argv, a crash file's first line) forms no
link, image or HTML when the summary is rendered (pasted into an issue, a chat, a notebook), and still reads as
what it was; blackbox's own link to a crash file still links (``views.text.inert``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from blackbox.views.stacks import crash_section
from blackbox.views.text import as_text, inert

MD = MarkdownIt("commonmark").enable("table")
ACTIVE = {"link_open", "image", "html_inline", "html_block"}
HOSTILE = ("**bold** `tick` [click here](http://evil.example/a) ![p](http://evil.example/p.png) "
           "<img src=x onerror=alert(1)> <http://evil.example/b> <!-- c --> \\`[y](http://evil.example/c)` "
           "`` a ` [q](http://evil.example/d) `` [r]: http://evil.example/e")  # fmt: skip


def _tokens(markdown: str) -> list[tuple[str, str]]:
    """(type, link target or content) of every block and inline token a CommonMark renderer makes."""
    out = []
    for tok in MD.parse(markdown):
        out.append((tok.type, tok.content))
        out += [(c.type, str(c.attrs.get("href") or c.attrs.get("src") or c.content)) for c in tok.children or []]
    return out


def _active(markdown: str) -> list[tuple[str, str]]:
    return [t for t in _tokens(markdown) if t[0] in ACTIVE]


def _text(markdown: str) -> str:
    """What a reader of the rendered page sees, markup aside."""
    return "".join(c for t, c in _tokens(markdown) if t in ("text", "code_inline"))


def test_hostile_text_in_a_line_forms_no_link_image_or_html_and_reads_as_written() -> None:
    line = f"- uncaught exception at step 2: ValueError: {HOSTILE}"
    assert len(_active(line)) >= 6  # the renderer reads the raw text as links, an image and HTML
    assert _active(inert(line)) == []
    assert "[click here](http://evil.example/a)" in _text(inert(line))
    assert "<img src=x onerror=alert(1)>" in _text(inert(line))


def test_read_as_text_in_a_terminal_or_a_log_the_escapes_are_taken_out() -> None:
    line = "- called from <module> (train.py:3): ValueError: [x](http://evil.example) <b>"
    assert "\\<module>" in inert(line) and as_text(inert(line)) == line


def test_blackbox_own_code_spans_and_emphasis_are_unchanged() -> None:
    ours = "**The job died of SIGSEGV.** Stack: `<module> (train.py:3)` ← `die (train.py:9)`; see `a](b`."
    assert inert(ours) == ours


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="[]()<>!`\\ab /:.", max_size=40), st.text(alphabet="[]()<>!`\\ab /:.", max_size=40))
def test_no_text_of_markdown_punctuation_makes_a_link_image_or_html(before: str, after: str) -> None:
    # the job's text around blackbox's own code span, as in "uncaught X: MESSAGE" or "replaced itself with `CMD`"
    line = f"- {before} `frame (x.py:1)` {after}<a href=x>[t](http://e)"
    assert _active(inert(line)) == []


def test_the_crash_file_is_still_linked_and_nothing_the_crash_file_says_is() -> None:
    crash = {"file": "crash-41.txt", "signal": "SIGSEGV", "first_line": "Fatal [x](http://evil.example) <b>",
             "stack": "<module> (t.py:1);die (t.py:3)"}  # fmt: skip
    section = inert("\n".join(crash_section(crash, "node-a bundle/")))
    assert _active(section) == [("link_open", "node-a%20bundle/crash-41.txt")]
    planted = inert("\n".join(crash_section({**crash, "file": "crash-1.txt](http://evil.example)"})))
    assert _active(planted) == []


@pytest.mark.slow
def test_a_job_whose_exception_message_is_markdown_gets_a_summary_with_none_of_it_active(tmp_path: Path) -> None:
    # GIVEN a job that dies of an exception whose message and command line are Markdown and HTML
    job = tmp_path / "train.py"
    job.write_text(f"import blackbox\nfor i in range(3):\n    blackbox.step()\nraise ValueError({HOSTILE!r})\n")
    done = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "runs"), "--quiet", "--",
                           sys.executable, str(job), "[arg](http://evil.example/f)"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1, done.stderr
    (bundle,) = (tmp_path / "runs").glob("run-*/bundle")
    # THEN the data keeps the message as written, and the rendered summary shows it with nothing active
    meta = json.loads((bundle / "metadata.json").read_text())
    assert any(HOSTILE in line for line in meta["death"]["evidence"]), meta["death"]
    summary = (bundle / "summary.md").read_text()
    assert _active(summary) == []
    shown = _text(summary)
    for planted in ("[click here](http://evil.example/a)", "![p](http://evil.example/p.png)",
                    "<img src=x onerror=alert(1)>", "<http://evil.example/b>", "<!-- c -->"):  # fmt: skip
        assert planted in shown, planted  # shown as the text it is
    assert "[arg](http://evil.example/f)" in shown
