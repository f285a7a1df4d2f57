"""Bounds and fixes for mistletoe's block parser, put in by one call: ``install_patches()``.

Importing this package imports mistletoe (``punctuation.import_mistletoe``, without its
scan of every code point) and changes nothing in it. ``install_patches()`` (idempotent,
thread-safe) replaces mistletoe's block readers with the ones here; it is called where a
worker is prepared (``run.worker.prepare``, before any fork) and where the parse stage
starts (``parse.parse``), so every process that parses has them.

The modules: ``punctuation`` (mistletoe's import), ``blocks`` (leaf blocks: tables, fences,
link definitions), ``lazy`` (CommonMark's container stack, for lazy lines), ``containers``
(list items, quotes, HTML blocks), ``fastpath`` (the tokenizer and the paragraph reader,
faster on plain lines) and ``install`` (the patches put in, and the small ones).

Two of mistletoe's block-level paths are worse than linear, and a corpus can
hold the input that hits them:

- **Nesting.** Every container level (a ``>`` quote, a list item) re-reads all
  the lines below it and then parses them again one level down: a "staircase" of
  quotes costs lines x depth, a very deep one runs into Python's recursion limit
  after minutes, and a staircase of indented lists copies the text once per level.
  The parse stage never descends past ``MAX_DEPTH`` anyway, so two levels below it we
  stop parsing: the container keeps its lines (its extent is decided by its parent)
  and has no children, so it becomes one leaf block. Deep documents are chunked, in
  time linear in their size, instead of failing.
- **Link reference definitions.** ``Footnote.read`` joins a whole run of
  definitions into one string and slices it from the current offset, several
  times per definition: quadratic in the run. The replacement (``blocks``) hands
  each definition a window of at least ``WINDOW`` characters of whole lines; a
  definition that does not match in its window is decided on everything left, so a
  run ends exactly where mistletoe ends it. The one difference: a title that runs over
  more than ``WINDOW`` characters of lines is cut short there (the definition keeps its
  destination, the rest is a paragraph), as in a renderer with a length limit.

And fixes where mistletoe parts from CommonMark / GFM, found by fuzzing against
markdown-it (``tests/fuzz_regressions/``):

- it closes a code fence at any line that starts with the fence and has no space in
  it, so ```` ```python ```` or ```` ```~ ```` ended a block; CommonMark (4.5) closes it
  only with a run of the same character, at least as long, then nothing but blanks;
- it takes ``a|b`` over ``---`` for a table; GFM wants as many header cells as
  delimiter cells, else no table (there, a setext heading);
- it ends a table at the first line without a ``|``; GFM ends it only at a blank
  line or the start of another block (a quote, fence, thematic break, list, ATX
  heading or HTML block), so ``Title`` then ``===`` right under a table are two rows;
- it lets a list item or a quote go on with any line that starts no other block
  ("lazy continuation"); CommonMark allows that only while a *paragraph* is open in
  it, so after a fence, a heading or an empty item the line ends the container (and
  ``alpha`` / ``===`` after it is a heading). ``lazy.Blocks`` follows the container's
  nested quotes and list items as CommonMark does, and says whether a paragraph is open.
  And a line without ``>`` that starts a list ends a quote whatever the list's number
  (``0.``) or content: the rule that only ``1.`` or a non-empty item may interrupt a
  paragraph holds inside the paragraph's own container only (commonmark.js, markdown-it).
  Nor does a lazy line end the container as a table header when the delimiter row under
  it does not go on with the container (``_interrupts``: GFM reads no table there).
  And a lazy line is text when the container's lines are read again (``lazy.lazy_text``): its
  indentation went on with the list items nested in the container, where what was left of a
  line indented 4 (text to CommonMark) could open a fence;
- it ends an HTML block opened by ``<script>``, ``<pre>``, ``<style>`` or ``<textarea>``
  only at its own closing tag; CommonMark (4.6, kind 1) ends it at a line with any of
  the four, so a ``<script>`` block closed by ``</pre>`` swallowed the rest;
- its patterns use Python's Unicode ``\\s`` and ``\\d`` where CommonMark means ASCII:
  ``#``+NBSP opened a heading, ``١. x`` and ``. x`` opened ordered lists, and a line
  indented by spaces then a Unicode blank (U+2028) did not continue a list item; and
  an HTML block or a link definition opened, or a quote went on, after a form feed or an NBSP.
  (A line of nothing but Unicode blanks, blank to mistletoe and text to CommonMark, is
  shown to mistletoe with a stand-in: see ``parse._visible_blanks``.)

The table rules follow markdown-it-py's ``rules_block/table.py`` (the reference the
contract checker uses), down to its cap on cells filled in for short rows.
"""

from pipeline.stages.mdpatch.install import MAX_DEPTH, install_patches

__all__ = ("MAX_DEPTH", "install_patches")
