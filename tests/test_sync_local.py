"""Incremental sync over a real folder: exactly the changed inputs are processed, nothing is lost."""

import os

import polars as pl
import pytest

import corpus.sync as sync_module
from corpus.chunk_sync import ChunkerSettings, sync_chunks
from corpus.sources.base import Fetched
from corpus.sources.local import LocalConnector
from corpus.sync import sync_sources
from search.embedding_window import load_token_offsets
from tests.support.files import make_eml, make_mbox, make_pdf

SETTINGS = ChunkerSettings(64, 8, 16_384, "all-MiniLM-L6-v2")


@pytest.fixture
def parse_calls(monkeypatch):
    calls: list[str] = []
    original = sync_module.parse_bytes

    def counting(data, name, *args, **kwargs):
        calls.append(name)
        return original(data, name, *args, **kwargs)

    monkeypatch.setattr(sync_module, "parse_bytes", counting)
    return calls


def make_corpus(root):
    root.mkdir(exist_ok=True)
    for i in range(6):
        (root / f"doc{i}.md").write_text(f"# Doc {i}\n\n" + f"Fact number {i} is about topic {i}. " * 20)
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "code.py").write_text("def answer():\n    return 42\n")


def connector(root, max_bytes=1_000_000):
    return LocalConnector(root, ["**/*"], ["**/*.skip"], "local:corpus", max_bytes)


def test_resync_processes_exactly_the_three_changes(tmp_path, parse_calls):
    root = tmp_path / "corpus"
    make_corpus(root)
    tokenizer = load_token_offsets()
    first = sync_sources([connector(root)], None, "web")
    assert first.counts.added == 7 and first.counts.quarantined == 0
    chunks1 = sync_chunks(first.documents, None, tokenizer, SETTINGS).chunks

    (root / "doc1.md").write_text("# Doc 1\n\nCompletely rewritten.")
    (root / "doc2.md").unlink()
    (root / "doc9.md").write_text("# Doc 9\n\nBrand new.")
    (root / "doc3.md").touch()  # mtime changes, content does not
    parse_calls.clear()
    second = sync_sources([connector(root)], first.documents, "web")
    counts = second.counts.as_dict()
    assert (counts["added"], counts["changed"], counts["deleted"], counts["unchanged"]) == (1, 1, 1, 5)
    assert sorted(parse_calls) == ["doc1.md", "doc9.md"]  # the touched file is read, hashed, not reparsed

    chunks2 = sync_chunks(second.documents, chunks1, tokenizer, SETTINGS)
    assert chunks2.rechunked_docs == 2
    unchanged_ids = second.documents.filter(~pl.col("doc_id").is_in(second.touched_doc_ids) & ~pl.col("deleted"))["doc_id"]
    before = chunks1.filter(pl.col("doc_id").is_in(unchanged_ids.to_list())).sort("chunk_id")["chunk_id"].to_list()
    after = chunks2.chunks.filter(pl.col("doc_id").is_in(unchanged_ids.to_list())).sort("chunk_id")["chunk_id"].to_list()
    assert before == after and before
    deleted = second.documents.filter(pl.col("deleted"))
    assert deleted["uri"].to_list() == ["doc2.md"] and deleted["text"].to_list() == [""]
    assert not chunks2.chunks.filter(pl.col("doc_id").is_in(deleted["doc_id"].to_list())).height


def test_bad_input_corpus_every_file_is_a_document_or_quarantined(tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    files = {
        "ok.md": b"# Fine\n\nGood text.",
        "page.html": b"<html><head><title>T</title></head><body><p>" + b"Readable paragraph of text. " * 10 + b"</p></body></html>",
        "report.pdf": make_pdf("Revenue grew."),
        "truncated.pdf": make_pdf("Revenue grew.")[:-60],
        "mail.eml": make_eml("Hello", "Body text"),
        "box.mbox": make_mbox([("A", "first"), ("B", "second")]),
        "binary.dat": bytes(range(256)) * 4,
        "latin1.txt": "café olé".encode("latin-1"),
        "empty.txt": b"",
        "huge.txt": b"x" * 5000,
        "ignored.skip": b"excluded by glob",
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    result = sync_sources([connector(root, max_bytes=4000)], None, "web")
    documents = set(result.documents["uri"].to_list())
    quarantined = dict(zip(result.quarantine["uri"].to_list(), result.quarantine["reason"].to_list()))
    assert documents == {"ok.md", "page.html", "report.pdf", "mail.eml", "box.mbox"}
    assert set(quarantined) == {"truncated.pdf", "binary.dat", "latin1.txt", "empty.txt", "huge.txt"}
    assert all(reason for reason in quarantined.values())
    assert "size limit" in quarantined["huge.txt"] and "truncated" in quarantined["truncated.pdf"]
    assert result.documents.filter(pl.col("uri") == "box.mbox").height == 2

    # A rerun retries quarantined inputs: fix one, and it comes in.
    (root / "latin1.txt").write_text("café olé")
    rerun = sync_sources([connector(root, max_bytes=4000)], result.documents, "web")
    assert "latin1.txt" in rerun.documents["uri"].to_list()
    assert rerun.counts.added == 1 and rerun.counts.quarantined == 4


def test_broken_new_version_keeps_the_old_document(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / "a.txt").write_text("good version")
    first = sync_sources([connector(root)], None, "web")
    (root / "a.txt").write_bytes(b"\x00\x00 broken")
    second = sync_sources([connector(root)], first.documents, "web")
    assert second.counts.quarantined == 1 and second.counts.deleted == 0
    assert second.documents["text"].to_list() == ["good version"]


def test_unlistable_source_keeps_documents(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / "a.txt").write_text("kept")
    first = sync_sources([connector(root)], None, "web")
    root.joinpath("a.txt").unlink()
    root.rmdir()
    second = sync_sources([connector(root)], first.documents, "web")
    assert second.counts.deleted == 0 and second.counts.quarantined == 1
    assert second.quarantine["stage"].to_list() == ["list"]
    assert second.documents["text"].to_list() == ["kept"]
    assert [(status.source, status.status) for status in second.sources] == [("local:corpus", "failed")]
    assert "not a folder" in second.failed_sources[0].reason and first.sources[0].status == "ok"


def test_each_source_has_its_own_status_and_counts(tmp_path):
    good = tmp_path / "good"
    make_corpus(good)
    result = sync_sources([connector(good), LocalConnector(tmp_path / "missing", ["**/*"], [], "local:missing", 1000)], None, "web")
    statuses = {status.source: status for status in result.sources}
    assert statuses["local:corpus"].status == "ok" and statuses["local:corpus"].counts.added == 7
    assert statuses["local:missing"].status == "failed" and statuses["local:missing"].counts.quarantined == 1
    assert result.counts.added == 7 and result.counts.quarantined == 1
    assert statuses["local:missing"].as_dict()["reason"] and "reason" not in statuses["local:corpus"].as_dict()


def write_bytes_named(folder, raw_name: bytes, data: bytes) -> None:
    """A file whose name is raw bytes, as a Latin-1 tool would leave it (Linux allows any bytes)."""
    with open(os.path.join(os.fsencode(folder), raw_name), "wb") as handle:
        handle.write(data)


def test_non_utf8_file_name_is_quarantined_and_the_rest_syncs(tmp_path):
    root = tmp_path / "names"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nA readable page.")
    write_bytes_named(root, b"bad\xffname.md", b"# Bad name\n\nText behind an undecodable name.")
    (root / "sub\udcff").mkdir()  # a folder with such a name taints every file under it
    (root / "sub\udcff" / "inner.md").write_text("# Inner\n\nText.")
    result = sync_sources([connector(root)], None, "web")
    assert result.documents["uri"].to_list() == ["good.md"]
    assert result.counts.added == 1 and result.counts.quarantined == 2
    assert sorted(result.quarantine["uri"].to_list()) == ["bad\\xffname.md", "sub\\xff/inner.md"]
    assert all("not valid UTF-8" in reason for reason in result.quarantine["reason"].to_list())
    # Both tables can be stored, which is where the raw name used to end the sync.
    result.documents.write_parquet(tmp_path / "documents.parquet")
    result.quarantine.write_parquet(tmp_path / "quarantine.parquet")
    rerun = sync_sources([connector(root)], result.documents, "web")
    assert rerun.counts.unchanged == 1 and rerun.counts.quarantined == 2 and rerun.counts.deleted == 0


class _ListedConnector:
    """A tiny connector over a fixed list of events: any connector may hand over such a uri."""

    source_key = "listed"

    def __init__(self, events):
        self.events = events

    def scan(self, previous):
        yield from self.events


def test_sync_quarantines_an_unstorable_uri_from_any_connector(tmp_path):
    events = [
        Fetched(uri="odd\udc80.md", version="v1", data=b"# Odd\n\nText.", name="odd\udc80.md"),
        Fetched(uri="fine.md", version="v1", data=b"# Fine\n\nText.", name="fine.md"),
    ]
    result = sync_sources([_ListedConnector(events)], None, "web")
    assert result.documents["uri"].to_list() == ["fine.md"]
    assert result.quarantine["uri"].to_list() == ["odd\\x80.md"]
    result.quarantine.write_parquet(tmp_path / "quarantine.parquet")


def test_links_pipes_and_sockets_are_quarantined_with_their_reason_never_read(tmp_path):
    import socket

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("# Secret\n\nOutside the source folder.")
    root = tmp_path / "special"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nA readable page.")
    (root / "inner-link.md").symlink_to(root / "good.md")
    (root / "escape.md").symlink_to(outside / "secret.md")
    (root / "dangling.md").symlink_to(tmp_path / "missing.md")
    (root / "folder-link").symlink_to(outside, target_is_directory=True)
    (root / "skipped-link").symlink_to(outside, target_is_directory=True)  # excluded below
    os.mkfifo(root / "pipe.md")  # opening it for reading would block the sync forever
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "sock.md"))
    try:
        source = LocalConnector(root, ["**/*"], ["skipped-link/**"], "local:special", 1_000_000)
        result = sync_sources([source], None, "web")
        rerun = sync_sources([source], result.documents, "web")
    finally:
        listener.close()
    assert result.documents["uri"].to_list() == ["good.md"]
    quarantined = dict(zip(result.quarantine["uri"].to_list(), result.quarantine["reason"].to_list()))
    assert set(quarantined) == {"inner-link.md", "escape.md", "dangling.md", "folder-link", "pipe.md", "sock.md"}
    assert all(quarantined[uri].startswith("symbolic link") for uri in ("inner-link.md", "escape.md", "dangling.md"))
    assert "folder" in quarantined["folder-link"]
    assert quarantined["pipe.md"].startswith("named pipe") and quarantined["sock.md"].startswith("socket")
    assert not [reason for reason in quarantined.values() if str(outside) in reason or str(tmp_path) in reason]
    assert set(result.quarantine["stage"].to_list()) == {"fetch"}
    assert rerun.counts.unchanged == 1 and rerun.counts.quarantined == 6 and rerun.counts.deleted == 0


def test_a_link_or_pipe_outside_the_include_globs_is_not_reported(tmp_path):
    root = tmp_path / "globbed"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\nA readable page.")
    (root / "notes.txt").symlink_to(root / "good.md")
    os.mkfifo(root / "pipe.log")
    result = sync_sources([LocalConnector(root, ["**/*.md"], [], "local:globbed", 1_000_000)], None, "web")
    assert result.documents["uri"].to_list() == ["good.md"] and result.quarantine.height == 0
