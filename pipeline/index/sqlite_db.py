"""The SQLite store's file: opening it (apsw + sqlite-vec, WAL), its schema, its transactions.

Why ``apsw`` and not ``pysqlite3-binary``: the stdlib ``sqlite3`` of many Pythons (this
machine's pyenv build among them) cannot load extensions; ``apsw`` can, ships wheels for
Linux, macOS and Windows with a current SQLite (FTS5 built in), and leaves transactions to
us (no implicit ``BEGIN``), which is what an all-or-nothing ``commit`` needs.
``pysqlite3-binary`` publishes Linux wheels only.

The store class that reads and writes these tables is ``pipeline.index.sqlite_store``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from pipeline.errors import UsageError
from pipeline.index.analyzer import FTS5_TOKENIZE
from pipeline.index.vector_store import StoreError

BATCH = 500  #: ids per ``IN (...)`` list
#: Bytes per page of a new index file: a row of ``chunks`` (payload and texts) spans several
#: default 4 KiB pages, and every vector lands in vec0's blocks; bigger pages mean fewer
#: overflow pages and fewer page writes per row. Set before the file's first table.
PAGE_SIZE = 16384
#: Pages a writer may keep in memory (KiB, as ``PRAGMA cache_size`` takes a negative number):
#: a run's one transaction touches every page it writes several times (chunks, FTS5, vec0,
#: the cache); with SQLite's default 2 MB most of them would spill to the WAL and be read back.
#: Memory, not durability: the WAL and ``synchronous`` are unchanged.
WRITER_CACHE_KIB = 256 * 1024
#: Bytes of new full-text terms FTS5 keeps in memory before writing them out as a segment
#: (its ``hashsize``; default 1 MiB): a first index's terms then make a few big segments
#: instead of dozens of small ones that its automerge keeps merging while the rows go in.
#: Memory, as above; what a query finds and scores is the same.
FTS_PENDING_BYTES = 64 * 1024 * 1024
#: WAL pages after which a writer's commit copies the WAL back into the file (SQLite's default:
#: 1,000). A run commits once per returned batch: at the default, every few batches a commit
#: also copied and synced the whole WAL, and the run's last commit did so for every row it
#: wrote. The writer checkpoints once instead, when it closes (after its commit: the index is
#: searchable before that); this bounds the WAL in between. The run's commit never checkpoints
#: (``deferred_checkpoint``): with the cache's batches already in the WAL, its pages would
#: cross this bound and make the commit wait for the whole WAL's copy and sync.
WRITER_CHECKPOINT_PAGES = 16384
#: Bytes a WAL file is cut back to after a checkpoint (a run's WAL may grow large; the file
#: is then truncated rather than kept at that size for readers that keep the database open).
WAL_SIZE_LIMIT = 64 * 1024 * 1024

#: The embedding cache: a rowid table with a unique (model, digest) index. Its rows carry a
#: vector each (1.5 KiB at 384 dims); as a ``WITHOUT ROWID`` table keyed by digest (random
#: order) every insert landed on a random page of big rows and split it, as the first layout
#: did (``upgrade_cache`` converts it). Here rows append and only the small index is random.
_CACHE_TABLE = (
    "CREATE TABLE {exists}{name}(model TEXT NOT NULL, digest TEXT NOT NULL,"
    " vector BLOB NOT NULL, tokens INTEGER NOT NULL, used INTEGER NOT NULL, UNIQUE(model, digest));"
)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS chunks(chunk_id TEXT NOT NULL UNIQUE, file TEXT NOT NULL,"
    " hash TEXT NOT NULL, digest TEXT NOT NULL, row_digest TEXT NOT NULL,"
    " model_tokens INTEGER NOT NULL, policy_hash TEXT NOT NULL, doc_id TEXT NOT NULL,"
    " section_id TEXT NOT NULL,"
    " source_file TEXT NOT NULL, text TEXT NOT NULL, payload BLOB NOT NULL);"
    # an incremental run reads the rows of the touched files; the cache's pruning
    # looks for old entries and for digests still in use: none of them a full scan.
    # No other column is looked up (``prepare_writer`` drops the doc_id and source_file
    # indexes of files written by an earlier version: every index slows each row written)
    "CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file);"
    "CREATE INDEX IF NOT EXISTS chunks_digest ON chunks(digest);"
    f"CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(body, tokenize='{FTS5_TOKENIZE}');"
    + _CACHE_TABLE.format(name="embed_cache", exists="IF NOT EXISTS ")
    + "CREATE INDEX IF NOT EXISTS embed_cache_used ON embed_cache(used);"
)


def open_database(path: Path) -> Any:
    """An ``apsw`` connection to ``path`` with sqlite-vec loaded, in WAL mode, its tables made."""
    try:
        import apsw
        import sqlite_vec
    except ImportError as exc:
        raise UsageError(
            f"the SQLite index needs apsw and sqlite-vec ({exc.name} is missing) "
            "(hint: pip install 'chunkyard[index]')"
        ) from None
    try:
        conn = apsw.Connection(str(path))
        conn.set_busy_timeout(10_000)
        conn.enable_load_extension(True)
        conn.load_extension(sqlite_vec.loadable_path())
        conn.enable_load_extension(False)
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file only; an existing one keeps its own
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a killed process loses nothing committed
    except apsw.Error as exc:
        raise StoreError(f"{path}: cannot open the index ({exc}) (hint: is it a chunkyard index?)") from None
    try:
        conn.execute(_SCHEMA)
    except apsw.Error as exc:
        raise StoreError(f"{path}: cannot set up the index ({exc})") from None
    return conn


@contextmanager
def transaction(conn: Any, path: Path) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception (a SIGKILL: SQLite's WAL)."""
    import apsw

    try:
        conn.execute("BEGIN IMMEDIATE")
    except apsw.Error as exc:
        raise StoreError(
            f"{path}: the index is locked by another writer ({exc}) "
            "(hint: wait for it, or find the process holding the file)"
        ) from None
    try:
        yield
        conn.execute("COMMIT")
    except apsw.Error as exc:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise StoreError(f"{path}: the index could not be written ({exc}); it is as it was") from None
    except BaseException:
        if not conn.get_autocommit():
            conn.execute("ROLLBACK")
        raise


def prepare_writer(conn: Any) -> None:
    """Ready a connection for writing, inside its first write transaction: the writer's page
    cache, its WAL checkpoints (``WRITER_CHECKPOINT_PAGES``; ``checkpoint_after_writes`` at
    close) and FTS5's pending terms, no index nothing looks up, and the cache table in its
    current layout (``upgrade_cache``)."""
    conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")
    conn.execute(f"PRAGMA wal_autocheckpoint={WRITER_CHECKPOINT_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    conn.execute("DROP INDEX IF EXISTS chunks_doc; DROP INDEX IF EXISTS chunks_source")
    conn.execute("INSERT INTO fts(fts, rank) VALUES ('hashsize', ?)", (FTS_PENDING_BYTES,))
    upgrade_cache(conn)


@contextmanager
def deferred_checkpoint(conn: Any) -> Iterator[None]:
    """No automatic checkpoint at the ``COMMIT``s until the exit (SQLite checkpoints after a
    commit that leaves the WAL over ``wal_autocheckpoint`` pages): a commit returns once its
    pages are in the WAL, and the writer's next commit or its close copies them. Entered
    inside a transaction, it must be left after that transaction's ``COMMIT``."""
    conn.execute("PRAGMA wal_autocheckpoint=0")
    try:
        yield
    finally:
        conn.execute(f"PRAGMA wal_autocheckpoint={WRITER_CHECKPOINT_PAGES}")


def checkpoint_after_writes(conn: Any) -> None:
    """Copy the WAL a writer left into the database file without waiting for readers
    (``PASSIVE``): the one checkpoint of a run (``WRITER_CHECKPOINT_PAGES``). A reader holding
    old pages leaves the rest for a later checkpoint; a busy file leaves it all."""
    import apsw

    with suppress(apsw.BusyError):
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")


def upgrade_cache(conn: Any) -> None:
    """Convert an ``embed_cache`` of the first layout (``WITHOUT ROWID``) to the rowid one, in
    the caller's transaction (a killed run leaves the old table whole). Readers never call it."""
    found = list(conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'embed_cache'"))
    if not found or "WITHOUT ROWID" not in str(found[0][0]).upper():
        return
    conn.execute(_CACHE_TABLE.format(name="embed_cache_upgrade", exists=""))
    conn.execute(
        "INSERT INTO embed_cache_upgrade(model, digest, vector, tokens, used) "
        "SELECT model, digest, vector, tokens, used FROM embed_cache"
    )
    conn.execute("DROP TABLE embed_cache")  # its index too
    conn.execute("ALTER TABLE embed_cache_upgrade RENAME TO embed_cache")
    conn.execute("CREATE INDEX embed_cache_used ON embed_cache(used)")


def in_batches(items: list[str]) -> Iterator[list[str]]:
    """``items`` in lists of at most ``BATCH``: each one ``IN (...)`` list of a query."""
    for i in range(0, len(items), BATCH):
        yield items[i : i + BATCH]
